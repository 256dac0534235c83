"""fastfeed inside other people's trainers. Each integration is a subpackage that imports its framework
only when imported itself (`pip install -e '.[<name>]'` in the fastfeed checkout):

    fastfeed.integrations.ultralytics   FastfeedTrainer for `YOLO(...).train(trainer=FastfeedTrainer)`
"""
