"""Test support: torchvision's `nms` operator in plain torch, for a torchvision whose C++ ops cannot load.

On this project's machines the only torchvision wheels for the pinned CPU torch 2.13.0 are PyPI's CUDA
builds: their `torchvision/_C.so` needs libcudart.so.13, libc10_cuda.so and libtorch_cuda.so, which the CPU
torch lacks, so `_C` fails to load and `import torchvision` then stops at `_meta_registrations.py`
("operator torchvision::nms does not exist"), and with it `import ultralytics`.

`install()`, called before torchvision is imported, first tries to load that `_C` library the way
torchvision does (`torch.ops.load_library`); if it loads, it does nothing. Otherwise it defines the
`torchvision::nms` and `torchvision::qnms` operators (schemas as in torchvision's C++ source) with
`torch.library`, implements `nms` on the CPU in plain torch (`qnms`, for quantized boxes, raises), imports
the real torchvision package, and makes `torchvision.extension._has_ops()` say True so that
`torchvision.ops.nms`, which Ultralytics' validation calls, reaches this implementation. Every other
torchvision operator (roi_align, deform_conv2d, ...) stays absent and fails when called:
Ultralytics' detection training and validation do not use them.
"""

from __future__ import annotations

import glob
import importlib.util
import os

import torch

_LIB: torch.library.Library | None = None
calls = 0  # how many times `nms` ran: the tests check that validation went through it


def nms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Greedy non-maximum suppression over (x1, y1, x2, y2) boxes: the indices kept, highest score first."""
    global calls
    calls += 1
    if dets.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=dets.device)
    order = scores.argsort(descending=True)
    boxes = dets[order].float()
    area = (boxes[:, 2] - boxes[:, 0]).clamp(min=0) * (boxes[:, 3] - boxes[:, 1]).clamp(min=0)
    lt = torch.max(boxes[:, None, :2], boxes[None, :, :2])
    rb = torch.min(boxes[:, None, 2:], boxes[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=2)
    iou = inter / (area[:, None] + area[None, :] - inter).clamp(min=torch.finfo(torch.float32).tiny)
    suppressed = torch.zeros(len(boxes), dtype=torch.bool)
    over = (iou > iou_threshold).cpu()
    keep = []
    for i in range(len(boxes)):
        if not suppressed[i]:
            keep.append(i)
            suppressed |= over[i]
    return order[torch.tensor(keep, dtype=torch.long, device=dets.device)]


def _qnms(dets: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    raise NotImplementedError("torchvision::qnms (quantized boxes) is not provided by tests/integrations/torchvision_cpu_ops.py")


def _c_ops_load() -> bool:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return True  # no torchvision: nothing to stand in for
    for path in glob.glob(os.path.join(list(spec.submodule_search_locations)[0], "_C*.so")):
        try:
            torch.ops.load_library(path)
            return True
        except OSError:
            return False
    return False


def install() -> bool:
    """Makes `import torchvision` work with these CPU ops if its own cannot load; True if it stood in."""
    global _LIB
    if _LIB is not None:
        return True
    if _c_ops_load():
        return False
    _LIB = torch.library.Library("torchvision", "DEF")
    _LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIB.impl("nms", nms, "CPU")
    _LIB.impl("qnms", _qnms, "CPU")
    import torchvision.extension

    torchvision.extension._has_ops = lambda: True
    return True
