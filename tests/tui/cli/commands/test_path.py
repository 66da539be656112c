"""`headscope path`: virtual heads along a composition path equal the dense products; malformed heads are usage errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from headscope.engine.circuits import directions
from headscope.engine.forward.torch_weights import torch_weights
from headscope.tui.cli import main as cli
from tests.conftest import INDUCTION_HEAD, PREV_TOKEN_HEAD
from tests.engine.circuits import test_directions
from tests.engine.circuits.test_directions import MODEL_PATH, head_weights

model = test_directions.model  # test_directions's pytest fixture


def test_virtual_heads_equal_the_dense_products(model: Any) -> None:
    w = torch_weights(model.weights)  # the dense products in torch float64, on the same arrays
    a, b = head_weights(w, *PREV_TOKEN_HEAD), head_weights(w, *INDUCTION_HEAD)
    w_e, w_u = w.get("embed.W_E").double(), w.get("unembed.W_U").double()
    ov_a = a["W_V"].double() @ a["W_O"].double()
    virtual = w_e @ ov_a @ b["W_V"].double() @ b["W_O"].double() @ w_u
    k_path = w_e @ b["W_Q"].double() @ b["W_K"].double().T @ ov_a.T @ w_e.T
    nw = model.weights
    torch.testing.assert_close(
        torch.from_numpy(directions.virtual_ov(nw, PREV_TOKEN_HEAD, INDUCTION_HEAD).AB).double(),
        virtual, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(
        torch.from_numpy(directions.k_path(nw, PREV_TOKEN_HEAD, INDUCTION_HEAD).AB).double(),
        k_path, atol=1e-3, rtol=1e-4)


def test_a_malformed_head_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.main(["path", str(MODEL_PATH), "L0H1", "L1.H2"])
    assert raised.value.code == cli.EXIT_USAGE
    assert "L1.H2" in capsys.readouterr().err
