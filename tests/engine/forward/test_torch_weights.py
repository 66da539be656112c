"""engine/forward/torch_weights.py: the forward layer's one view of the numpy weights."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from headscope.engine.forward.torch_weights import TorchWeights, torch_weights
from headscope.engine.model.loading import load_model


def test_tensors_share_the_cached_arrays_and_warn_nothing(gpt2_dir) -> None:
    w = load_model(gpt2_dir[0]).weights
    tw = torch_weights(w)
    assert torch_weights(tw) is tw and isinstance(tw, TorchWeights) and tw.cfg is w.cfg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = tw.get("blocks.0.attn.W_Q")
        h = tw.get_head("blocks.0.attn.W_Q", 1)
    a = w.get("blocks.0.attn.W_Q")
    assert not a.flags.writeable  # numpy code cannot edit a cached weight
    assert t.dtype == torch.float32 and t.data_ptr() == a.__array_interface__["data"][0]  # zero-copy
    assert np.array_equal(t.numpy(), a) and np.array_equal(h.numpy(), w.get_head("blocks.0.attn.W_Q", 1))
