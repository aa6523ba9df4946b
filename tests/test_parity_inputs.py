"""Input sets beyond the example: generated (seeds, large, zeros), from files, and per-output
tolerances."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

import dualexport as dx
from dualexport.parity.inputs import generate_input_sets, inputs_with_shapes
from models import MLP, TiedEmbedding


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> dx.ExportResult:
    return dx.export(MLP(), (torch.randn(3, 16),), out_dir=tmp_path_factory.mktemp("in"), name="m")


def test_generated_sets_keep_integer_inputs_in_range() -> None:
    ids = torch.tensor([[3, 7, 49], [0, 12, 5]])
    sets = dict(generate_input_sets([ids, torch.randn(2, 3)], seeds=2))
    assert set(sets) == {"seed0", "seed1", "large", "zeros"}
    for label, (i, _x) in sets.items():
        assert i.dtype == torch.int64 and int(i.min()) >= 0 and int(i.max()) <= 49, label
    assert float(sets["large"][1].abs().max()) > 100 and not sets["zeros"][1].any()


def test_positions_stay_positions_at_every_length() -> None:
    """A decoder's ``cache_position`` (0..7 in the example) at a range edge of 510: 0..509, not
    510 draws from 0..7 (a cache written twice at one position is undefined, and a correct file
    failed its proof that way); token ids are still drawn from their range; a row that does not
    count up by one is not taken for positions."""
    ids = torch.linspace(0, 255, 8).long().unsqueeze(0)
    pos, pos2d, other = torch.arange(8), torch.arange(4, 12).unsqueeze(0), torch.tensor([[3, 4, 6]])
    got = inputs_with_shapes([ids, pos, pos2d, other], [(1, 510), (510,), (1, 510), (1, 510)])
    assert torch.equal(got[1], torch.arange(510)) and torch.equal(got[2], torch.arange(4, 514).unsqueeze(0))
    assert got[0].shape == (1, 510) and 0 <= int(got[0].min()) and int(got[0].max()) <= 255
    assert len(set(got[0].tolist()[0])) < 510 and set(got[3].tolist()[0]) <= {3, 4, 5, 6}
    for _, flat in generate_input_sets([ids, pos]):
        assert torch.equal(flat[1], pos)


def test_compare_with_generated_sets(mlp: dx.ExportResult) -> None:
    report = dx.compare(mlp, generate=2)
    assert report.ok, report.to_markdown()
    assert report.inputs == ("example", "seed0", "seed1", "large", "zeros")
    # a real run on large values: what the generator handed to compare is ~1000x the example
    sets = dict(generate_input_sets([torch.randn(3, 16)], seeds=2))
    assert float(sets["large"][0].abs().max()) > 500
    large = next(o for o in report.outputs if o.label.startswith("large"))
    assert all(m.ok and m.snr_db > 60 for m in large.metrics.values()), large.metrics


def test_generated_sets_for_token_ids(tmp_path: pathlib.Path) -> None:
    res = dx.export(TiedEmbedding(), (torch.randint(0, 50, (2, 5)),), out_dir=tmp_path, name="t")
    assert dx.compare(res, generate=1).ok  # ids out of range would crash the embedding


def test_inputs_from_npz_and_pt(mlp: dx.ExportResult, tmp_path: pathlib.Path) -> None:
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    rep = dx.compare(mlp, inputs=tmp_path / "in.npz")
    assert rep.ok and rep.inputs == ("example", "file0") and rep.outputs[-1].shape == (3, 8)
    torch.save([(torch.randn(3, 16),), (torch.randn(3, 16),)], tmp_path / "in.pt")
    assert dx.compare(mlp, inputs=tmp_path / "in.pt").inputs == ("example", "file0", "file1")


def test_pickled_input_file_is_refused(mlp: dx.ExportResult, tmp_path: pathlib.Path) -> None:
    import pickle

    (tmp_path / "evil.pt").write_bytes(pickle.dumps({"x": object()}))
    with pytest.raises(dx.ArtifactIOError, match="weights_only"):
        dx.compare(mlp, inputs=tmp_path / "evil.pt")


def test_per_output_tolerance_override(mlp: dx.ExportResult) -> None:
    strict = dx.compare(mlp, tolerances={0: (0.0, 0.0)})
    o = strict.outputs[0]
    assert o.tolerance["onnx"].source == "user override" and o.tolerance["onnx"].atol == 0.0
    assert dx.compare(mlp, tolerances={0: (1e-3, 1e-3)}).outputs[0].tolerance["xnnpack"].atol == 1e-3
