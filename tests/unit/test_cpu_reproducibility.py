"""fedhop asks MKL for reproducible results before torch loads (fedhop/__init__.py, issue 19)."""

import importlib
import os

import pytest

import fedhop


def test_importing_fedhop_sets_mkl_conditional_reproducibility(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MKL_CBWR", raising=False)
    importlib.reload(fedhop)
    assert os.environ["MKL_CBWR"] == "AUTO,STRICT"


def test_a_users_own_mkl_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    importlib.reload(fedhop)
    assert os.environ["MKL_CBWR"] == "COMPATIBLE"
