"""fastfeed inside other people's trainers. Each integration is a subpackage that imports its framework
only when imported itself (`pip install fastfeed[<name>]`):

    fastfeed.integrations.ultralytics   FastfeedTrainer for `YOLO(...).train(trainer=FastfeedTrainer)`
"""
