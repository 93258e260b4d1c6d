"""`mhsa bind WEIGHTS.safetensors` (mhsa/bind.py): it binds an Adam companion saved before
checkpoints were bound, so that --resume takes it; it refuses to rebind a companion bound to other
weights unless --force, and then says what it overrode; a second bind has nothing to do."""

import shutil
import subprocess
import sys

import pytest

from shared import checkpoint, weights
from shared.adam_state import companion_path
from tests.contract.test_checkpoint import save, unbound
from tests.paths import ROOT


def bind(*argv):
    return subprocess.run([sys.executable, "-m", "mhsa.cli", "bind", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_bind_binds_a_companion_from_before_the_binding_so_that_it_resumes(tmp_path):
    path = tmp_path / "run.safetensors"
    unbound(path)
    done = bind(str(path))
    assert done.returncode == 0, done.stderr
    assert checkpoint.load(path)[1].step == 6


@pytest.mark.slow
def test_bind_refuses_a_companion_bound_to_other_weights_unless_forced_and_says_what_it_overrode(tmp_path):
    save(tmp_path / "r1.safetensors", seed=0)
    save(tmp_path / "r2.safetensors", seed=1, scale=3.0)
    path = tmp_path / "m.safetensors"
    shutil.copy(tmp_path / "r2.safetensors", path)
    shutil.copy(tmp_path / "r1.adam.safetensors", companion_path(path))  # the 1st run's moments beside the 2nd run's weights
    before = companion_path(path).read_bytes()
    refused = bind(str(path))
    assert refused.returncode == 2 and companion_path(path).read_bytes() == before
    r1, r2 = weights.read(tmp_path / "r1.safetensors").digest, weights.read(path).digest
    assert refused.stderr == (
        f"mhsa bind: error: {str(companion_path(path))!r} is already bound to other weights (sha256 {r1[:12]}..., the file beside it: "
        f"{r2[:12]}...): it belongs to another run or to a save that was interrupted; refusing to rebind it "
        "(--force rebinds it anyway, and --resume would then continue these weights with its moments)\n"
    )
    with pytest.raises(ValueError, match="belongs to other weights"):
        checkpoint.load(path)
    forced = bind(str(path), "--force")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout == (
        f"bound {companion_path(path)} to {path} (--force: it was bound to other weights, sha256 {r1[:12]}...; now {r2[:12]}...)\n"
    )
    assert checkpoint.load(path)[1].weights_sha256 == r2
    again = bind(str(path))
    assert again.returncode == 0 and again.stdout == f"{companion_path(path)} is already bound to {path}: nothing to do\n"
