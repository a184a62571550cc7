"""Trace files: gzip (bounded inflation), atomic writes, and the kinds table."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hooktrace.schema import TraceFormatError
from hooktrace.validate import load
from tests.trace_samples import realistic, sample

SAMPLES = Path(__file__).resolve().parent.parent / "samples"

# -- gzip ----------------------------------------------------------------------------------------------------


def test_gzip_is_opt_in_by_file_name_and_read_by_content(tmp_path):
    t = sample()
    t.save(tmp_path / "t.json.gz")
    raw = (tmp_path / "t.json.gz").read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    assert gzip.decompress(raw) == t.to_json()  # the same JSON inside
    assert load(tmp_path / "t.json.gz").to_dict() == t.to_dict()
    (tmp_path / "renamed.json").write_bytes(raw)
    assert load(tmp_path / "renamed.json").to_dict() == t.to_dict()
    t.save(tmp_path / "plain.json")
    assert (tmp_path / "plain.json").read_bytes()[:1] == b"{"


def test_broken_gzip_is_a_format_error(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(TraceFormatError, match="gzip"):
        load(path)
    path.write_bytes(gzip.compress(sample().to_json())[:-30])  # cut short
    with pytest.raises(TraceFormatError, match="gzip"):
        load(path)


def test_a_gzip_bomb_is_refused_within_a_memory_limit(tmp_path):
    """1 GiB of JSON whitespace in about 1 MB of gzip, loaded with 600 MiB of address space."""
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * (1 << 20)
    parts = [packer.compress(b'{"format":"hooktrace.trace",')]
    parts += [packer.compress(block) for _ in range(1024)]
    parts.append(packer.compress(b"}") + packer.flush())
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(b"".join(parts))
    assert bomb.stat().st_size < 2 << 20
    code = textwrap.dedent(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (600 << 20, 600 << 20))
        from hooktrace.schema import TraceFormatError
        from hooktrace.validate import load
        try:
            load({str(bomb)!r})
        except TraceFormatError as exc:
            print("refused:", exc)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("refused:") and "inflates to more than" in proc.stdout


def test_a_large_real_trace_inflates_within_the_bound(tmp_path):
    realistic(300_000).save(tmp_path / "t.json.gz")
    assert len(load(tmp_path / "t.json.gz").events) == 300_000


# -- kinds table -----------------------------------------------------------------------------------------


def test_kinds_table_covers_spec_v2():
    from hooktrace import kinds

    assert kinds.SCOPES == ("module", "global", "tensor", "node", "optimizer", "saved_tensors", "engine")
    assert kinds.PHASES == ("forward", "backward", "recompute", "optimizer", "other")
    assert kinds.kinds_of("tensor") == ("grad", "post_accumulate_grad", "multi_grad", "leaf_multi_grad")
    assert kinds.kinds_of("engine") == ("final_callback",)
    assert kinds.kinds_of("node") == ("node_pre", "node")
    assert kinds.kinds_of("saved_tensors") == ("pack", "unpack")
    assert set(kinds.kinds_of("optimizer")) == {
        "optimizer_step_pre",
        "optimizer_step_post",
        "optimizer_state_dict_pre",
        "optimizer_state_dict",
        "optimizer_load_state_dict_pre",
        "optimizer_load_state_dict_post",
    }
    assert set(kinds.kinds_of("global")) == set(kinds.MODULE_KINDS) | set(kinds.REGISTRATION_KINDS) | {
        "optimizer_step_pre",
        "optimizer_step_post",
    }
    assert {"forward_wrapper", "comm"} <= set(kinds.kinds_of("module"))
    for k in kinds.TABLE.values():
        assert k.scopes and set(k.scopes) <= set(kinds.SCOPES)
        assert k.phase is kinds.ENCLOSING or k.phase in kinds.PHASES
        assert k.label and kinds.label(k.name) == k.label
    assert kinds.TABLE["forward"].phase is kinds.ENCLOSING and kinds.TABLE["grad"].phase == "backward"
    assert kinds.label("no_such_kind") == "no_such_kind"


# -- atomic writes -----------------------------------------------------------------------------------------


def test_write_atomic_replaces_keeps_mode_and_leaves_no_temp(tmp_path):
    import os

    from hooktrace.io import write_atomic

    path = tmp_path / "out.txt"
    write_atomic(path, "first")
    assert path.read_text() == "first"
    os.chmod(path, 0o640)
    write_atomic(path, b"second")
    assert path.read_bytes() == b"second" and (os.stat(path).st_mode & 0o777) == 0o640
    write_atomic(path, lambda fh: fh.write(b"third"))
    assert path.read_bytes() == b"third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_write_atomic_failure_leaves_the_old_file(tmp_path):
    from hooktrace.io import write_atomic

    path = tmp_path / "out.txt"
    path.write_text("good")

    def failing(fh):
        fh.write(b"partial")
        raise RuntimeError("mid-way")

    with pytest.raises(RuntimeError, match="mid-way"):
        write_atomic(path, failing)
    assert path.read_text() == "good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    with pytest.raises(RuntimeError):
        write_atomic(tmp_path / "new.txt", failing)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_write_atomic_under_a_file_size_limit_leaves_the_old_file(tmp_path):
    """RLIMIT_FSIZE: the write fails part-way (EFBIG); the earlier file stays whole."""
    import subprocess
    import textwrap

    path = tmp_path / "out.json"
    path.write_bytes(b"x" * 10_000)
    code = textwrap.dedent(
        f"""
        import resource, signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        from hooktrace.io import write_atomic
        try:
            write_atomic({str(path)!r}, b"y" * 100_000)
        except OSError as exc:
            print("failed", exc.errno)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("failed")
    assert path.read_bytes() == b"x" * 10_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_write_atomic_through_a_symlink_keeps_the_link(tmp_path):
    from hooktrace.io import write_atomic

    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    write_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_failed_save_leaves_the_earlier_trace(tmp_path, name):
    """An event that cannot be encoded fails the save mid-way; the earlier file stays as it was."""
    path = tmp_path / name
    sample().save(path)
    before = path.read_bytes()
    broken = realistic(3000)
    broken.events[2500] = broken.events[2500]._replace(error=object())
    with pytest.raises(TypeError):  # orjson's JSONEncodeError
        broken.save(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_save_under_a_file_size_limit_leaves_the_earlier_trace(tmp_path, name):
    """`-o x.json` / `x.json.gz` over a good trace, under RLIMIT_FSIZE: the write fails, the good
    trace stays whole (the old writer truncated it first)."""
    path = tmp_path / name
    sample().save(path)
    before = path.read_bytes()
    code = textwrap.dedent(
        f"""
        import resource, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        from tests.trace_samples import realistic
        big = realistic(100_000)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len({before!r}) + 100, resource.RLIM_INFINITY))
        try:
            big.save({str(path)!r})
        except OSError as exc:
            print("failed", exc.errno)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.stdout.startswith("failed"), proc.stderr[-2000:]
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


# -- what is not a trace file ---------------------------------------------------------------------------------


def _special(kind: str, tmp_path: Path) -> str:
    """A path that is not a regular file, made without blocking (a FIFO with no writer)."""
    import os
    import socket

    if kind == "fifo":
        path = tmp_path / "t.json"
        os.mkfifo(path)
        return str(path)
    if kind == "socket":
        path = tmp_path / "t.sock"
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
        return str(path)
    if kind == "folder":
        return str(tmp_path)
    return kind  # a device


SPECIAL = ["fifo", "/dev/zero", "/dev/null", "/dev/urandom", "folder", "socket"]


@pytest.mark.parametrize("kind", SPECIAL)
def test_load_refuses_what_is_not_a_regular_file_without_reading_it(tmp_path, kind):
    path = _special(kind, tmp_path)
    with pytest.raises(TraceFormatError, match="not a regular file"):
        load(path)  # a FIFO with no writer would block here; /dev/zero would fill the memory


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero"])
@pytest.mark.parametrize("command", ["render", "diff", "check"])
def test_the_cli_says_error_for_what_is_not_a_regular_file(tmp_path, kind, command):
    path = _special(kind, tmp_path)
    good = tmp_path / "good.json"
    sample().save(good)
    args = {
        "render": ["render", path],
        "diff": ["diff", str(good), path],
        "check": ["run", str(SAMPLES / "quickstart.py"), "--check", path],
    }[command]
    script = Path(sys.executable).with_name("hooktrace")
    done = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=120)  # no hang
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: cannot read ") and "not a regular file" in line


def test_a_file_larger_than_the_bound_is_refused_by_its_size(tmp_path):
    from hooktrace import io

    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(io.READ_CAP + 1)  # sparse: no disk space, and never read
    with pytest.raises(TraceFormatError, match="larger than 2048 MiB"):
        load(big)
    exact = tmp_path / "exact.json"
    exact.write_bytes(sample().to_json())
    size = exact.stat().st_size
    assert io.read_bytes(exact, limit=size) == sample().to_json()  # the nearest case: at the bound
    with pytest.raises(TraceFormatError, match="larger than"):
        io.read_bytes(exact, limit=size - 1)


# -- names: the longest legal one, and .gz in any case --------------------------------------------------------

LONGEST = ["a" * 250 + ".json", "é" * 125 + ".json", "b" * 247 + ".json.gz"]  # 255 bytes each


@pytest.mark.parametrize("name", LONGEST, ids=["ascii", "two-byte letters", "gz"])
def test_a_name_of_the_longest_legal_length_is_written_and_no_temp_is_left(tmp_path, name):
    assert len(name.encode()) == 255
    t = sample()
    t.save(tmp_path / name)
    assert load(tmp_path / name).to_dict() == t.to_dict()
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_the_cli_writes_a_rendering_under_the_longest_legal_name(tmp_path, capsys):
    from hooktrace.cli import main

    sample().save(tmp_path / "t.json")
    name = "c" * 251 + ".txt"
    assert main(["render", str(tmp_path / "t.json"), "-o", str(tmp_path / name)]) == 0, (
        capsys.readouterr().err
    )
    assert (tmp_path / name).read_text().startswith("# hooktrace")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "t.json"])


GZ_NAMES = [
    ("x.json.gz", None),
    ("X.JSON.GZ", None),
    ("x.Json.Gz", None),
    ("x.txt.gz", None),
    ("x.dot.gz", None),
    ("x.svg.gz", None),
    ("x.json.gz", "chrome"),
    ("x.gz", "dot"),
]


@pytest.mark.parametrize(("name", "fmt"), GZ_NAMES, ids=[f"{n}-{f}" for n, f in GZ_NAMES])
def test_every_output_named_gz_is_gzip_compressed_whatever_the_case(tmp_path, capsys, name, fmt):
    from hooktrace.cli import main
    from hooktrace.render import format_for_path, render

    if name.endswith("svg.gz") and not shutil.which("dot"):
        pytest.skip("Graphviz dot is not installed")
    sample().save(tmp_path / "t.json")
    args = ["render", str(tmp_path / "t.json"), "-o", str(tmp_path / name)] + (["-f", fmt] if fmt else [])
    assert main(args) == 0, capsys.readouterr().err
    raw = (tmp_path / name).read_bytes()
    assert raw[:2] == b"\x1f\x8b", "a .gz name holds gzip"
    chosen = format_for_path(name, fmt)
    inside = gzip.decompress(raw)
    if chosen == "json":
        assert load(tmp_path / name).to_dict() == sample().to_dict()
    elif (
        chosen != "svg"
    ):  # the same rendering as without .gz (an SVG carries no date either, but dot may vary)
        expected = render(sample(), chosen)
        assert inside == (expected.encode() if isinstance(expected, str) else expected)


def test_an_order_file_written_gz_is_read_back_by_diff(tmp_path, capsys):
    from hooktrace.cli import main

    sample().save(tmp_path / "t.json")
    assert main(["render", str(tmp_path / "t.json"), "-o", str(tmp_path / "o.TXT.GZ")]) == 0
    assert main(["diff", str(tmp_path / "o.TXT.GZ"), str(tmp_path / "t.json")]) == 0
    assert "same hook order" in capsys.readouterr().out
