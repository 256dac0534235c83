"""A FastfeedTrainer run stopped by a SIGTERM (mid-epoch, or at an epoch's end with gradients pending) and resumed with
Ultralytics' `resume=True` takes the optimizer steps the uninterrupted run takes (the accumulation rhythm and the
warmup ramp continue from the checkpoint's batch) and ends with its weights, tensor for tensor (model, EMA, updates)."""

from __future__ import annotations

import pytest
import torch
from ultra_data import sample_yolo, sample_yolo_master  # noqa: F401  (fixtures)

pytest.importorskip("ultralytics")

from ddp_trainer import RecordingTrainer  # noqa: E402
from ultralytics import YOLO  # noqa: E402
from ultralytics.nn.tasks import load_checkpoint  # noqa: E402
from ultralytics.utils.torch_utils import unwrap_model  # noqa: E402

from fastfeed.integrations.ultralytics import Preempted  # noqa: E402
from fastfeed.integrations.ultralytics.exact import STATE_KEY  # noqa: E402

# 16 images / batch 2 = 8 batches per epoch; nbs=6: accumulate 3; warmup_epochs=1: the ramp (accumulate 1 -> 3,
# learning rates and momentum) spans epoch 0, where the stop falls. Steps of the uninterrupted run (batch counts):
# 0, 1, 3, 5 in epoch 0, then 8, 11, 14.
RUN = dict(imgsz=64, batch=2, nbs=6, epochs=2, close_mosaic=0, device="cpu", plots=False, workers=0, seed=0,
           deterministic=True, val=False, warmup_epochs=1, amp=False)


class StepTrainer(RecordingTrainer):
    """Keeps (epoch, batch) of every optimizer step."""

    def optimizer_step(self):
        self.steps = getattr(self, "steps", [])
        self.steps.append((self.epoch, self.train_loader.position - 1))
        super().optimizer_step()


def _weights(trainer) -> dict[str, torch.Tensor]:
    model = {f"model.{k}": v for k, v in unwrap_model(trainer.model).state_dict().items()}
    return model | {f"ema.{k}": v for k, v in trainer.ema.ema.state_dict().items()}


@pytest.mark.slow
@pytest.mark.parametrize(("signal", "stop", "done"), [
    ("0:0:2", "stopped after 4 batches of epoch 1", 3),   # in batch 2, which takes no step: the stop comes after 3
    ("0:0:7", "stopped at the end of epoch 1", 4),        # no step after batch 5: gradients of 6 and 7 are pending
])
def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights(sample_yolo, tmp_path, monkeypatch,  # noqa: F811
                                                               signal, stop, done):
    monkeypatch.delenv("FF_SIGNAL", raising=False)
    data = str(sample_yolo / "data.yaml")
    whole = YOLO("yolov8n.yaml")
    whole.train(data=data, trainer=StepTrainer, project=str(tmp_path), name="u", **RUN)
    reference = whole.trainer
    assert reference.steps == [(0, 0), (0, 1), (0, 3), (0, 5), (1, 0), (1, 3), (1, 6)]

    monkeypatch.setenv("FF_SIGNAL", signal)
    stopped = YOLO("yolov8n.yaml")
    with pytest.raises(Preempted, match=stop):
        stopped.train(data=data, trainer=StepTrainer, project=str(tmp_path), name="a", **RUN)
    last = tmp_path / "a" / "weights" / "last.pt"
    _, ckpt = load_checkpoint(last)
    assert ckpt[STATE_KEY]["last_step"] == reference.steps[done - 1][1] and ckpt[STATE_KEY]["updates"] == done

    resumed = YOLO(str(last))
    resumed.train(resume=True, trainer=StepTrainer)
    assert stopped.trainer.steps == reference.steps[:done]
    assert resumed.trainer.steps == reference.steps[done:]   # after batch 2 without the rhythm: 6 steps, not 4
    assert resumed.trainer.ema.updates == reference.ema.updates == 7
    ours, theirs = _weights(resumed.trainer), _weights(reference)
    assert ours.keys() == theirs.keys()
    differ = [k for k in theirs if not torch.equal(ours[k], theirs[k])]
    assert not differ, f"{len(differ)} of {len(theirs)} tensors differ, first {differ[:3]}"
