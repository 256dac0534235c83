"""`DevicePrefetcher`: batches already on the device, as floats, ahead of the step that needs them.

    with create_loader("cpu", store, cfg) as loader, DevicePrefetcher(loader, "cuda") as batches:
        for epoch in range(epochs):
            batches.set_epoch(epoch)                  # passes through to the loader
            for images, targets in batches:           # float [B,3,S,S] in [0,1] and [M,6], on the GPU
                ...

cuda / npu. One side stream for the prefetcher's whole life. Each batch's uint8 images (pinned by the
loader) and its targets are copied on it with non_blocking=True, then converted there (/255, dtype)
and, with device augmentation, jittered and flipped there too; `depth` batches are in flight while
the consumer works on one. Handing a batch out, the consumer's current stream waits on that batch's
own `ready` event (not on the whole side stream, which may already be copying later batches), and
each handed-out tensor gets `record_stream(consumer)`, so the caching allocator does not reuse its
memory while kernels queued on the consumer's stream still read it. Both accelerators share this
code: `fastfeed.devices.accelerator_module` gives their Stream/Event API (and imports `torch_npu`,
which registers `torch.npu`, only for device "npu").

cpu. A background thread stays `depth` converted batches ahead through a bounded queue, so loading
overlaps the step even without an accelerator (`thread=True` does the same on an accelerator, which
also hides the time the host spends inside next(loader)). Device augmentation works on the CPU too,
but in float32 torch it costs far more than the workers' uint8 OpenCV version: leave it to them there.
`dtype=torch.uint8` skips the conversion (the images are still copied out of the loader's buffers).

The buffer-reuse hazard. A loader's batch is valid only until the next one is requested: the cpu
loader's workers overwrite batch k-1's slot as soon as batch k is asked for. So before asking the
loader for another batch, the prefetcher makes sure the last one has been read: on an accelerator
it synchronises the event recorded right after that batch's H2D copy (its conversion may still
run: that reads device memory only); on the CPU the conversion to float (or a clone) is the copy. In the
steady state that copy finished a whole step earlier, so the host does not wait.

Layout: `prefetcher.py` (DevicePrefetcher: one batch's produce / release / hand-out), `drivers.py` (inline, or the
fastfeed-device-prefetch thread),
`streams.py` (the accelerator API through the device's torch module), `augment.py` (which device augmentation applies). Device augmentation lives in
`fastfeed/device_augment.py` (torch only).
"""

from ..device_augment import DeviceAugment
from .prefetcher import DTYPES, DevicePrefetcher

__all__ = ["DTYPES", "DeviceAugment", "DevicePrefetcher"]
