"""The moving average of the weights: its arithmetic, the swap for evaluation and saving, and resume."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from bertzoo.trainer import train as train_module
from bertzoo.trainer.averaging import RAW_PREFIX, WeightAverage
from bertzoo.trainer.checkpoint import load_model, resolve_checkpoint
from conftest import interrupt_training


def test_the_average_follows_the_capped_decay_and_swaps_back():
    layer = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(0.0)
    average = WeightAverage(layer, share=0.5, total_steps=20)  # decay 1 - 1/10 = 0.9
    expected = torch.zeros(1, 2)
    for step in range(1, 31):
        with torch.no_grad():
            layer.weight.fill_(float(step))
        average.update()
        decay = min(0.9, (1 + step) / (10 + step))
        expected = decay * expected + (1 - decay) * float(step)
    assert torch.allclose(average.average[0], expected)
    with average.applied() as raw:
        assert torch.allclose(layer.weight, expected)
        assert torch.equal(raw[RAW_PREFIX + "weight"], torch.full((1, 2), 30.0))
    assert torch.equal(layer.weight, torch.full((1, 2), 30.0))  # training's weights are back


def test_an_averaged_run_saves_the_average_and_resumes_exactly(tiny_train_config, tmp_path, monkeypatch):
    options = dict(eval_every_epoch=False, weight_average=0.3)
    expected, _ = train_module.train(tiny_train_config(out_dir=str(tmp_path / "a"), **options))
    checkpoint = resolve_checkpoint(tmp_path / "a")
    saved, _, _ = load_model(checkpoint)
    raw = load_file(str(checkpoint / "trainer_state.safetensors"))
    differs = False
    for name, tensor in expected.state_dict().items():
        assert torch.equal(tensor, saved.state_dict()[name]), f"{name}: the returned model is not the saved one"
        if RAW_PREFIX + name in raw:
            differs |= not torch.equal(tensor, raw[RAW_PREFIX + name])
    assert differs, "the saved weights should be the average, not the last step's"

    interrupted = tiny_train_config(out_dir=str(tmp_path / "b"), **options)
    interrupt_training(monkeypatch, interrupted, at_loss_call=40)  # after the first epoch's checkpoint
    resumed, _ = train_module.train(interrupted, resume=True)
    for name, tensor in expected.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), f"{name} differs after resume"


def test_a_resume_with_averaging_turned_off_goes_on_from_the_raw_weights(tiny_train_config, tmp_path, monkeypatch):
    # Averaging does not change training, so the run with no averaging at all is what this one must end at.
    expected, _ = train_module.train(tiny_train_config(out_dir=str(tmp_path / "a"), eval_every_epoch=False))
    interrupted = tiny_train_config(out_dir=str(tmp_path / "b"), eval_every_epoch=False, weight_average=0.3)
    interrupt_training(monkeypatch, interrupted, at_loss_call=40)  # after the first epoch's (averaged) checkpoint
    resumed, _ = train_module.train(tiny_train_config(out_dir=str(tmp_path / "b"), eval_every_epoch=False),
                                    resume=True)
    for name, tensor in expected.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), f"{name} differs after resume"


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_weight_average_outside_0_1_is_refused(tiny_train_config, share):
    with pytest.raises(ValueError, match="weight_average must be in"):
        tiny_train_config(weight_average=share)
