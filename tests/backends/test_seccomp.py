"""The bwrap seccomp filter: the program as data, then run for real under bwrap."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess

import pytest

from sono.backends import seccomp
from sono.backends.bwrap import bundled_bwrap

# An errno no path of these calls returns by itself: seeing it proves the filter answered.
MARK = 222


def insns(program: bytes) -> list[tuple[int, int, int, int]]:
    return [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]


@pytest.mark.parametrize("arch", sorted(seccomp.SYSCALLS))
def test_program_checks_the_architecture_first(arch: str) -> None:
    program = seccomp.filter_program(arch)
    assert program is not None and len(program) % 8 == 0
    code = insns(program)
    assert code[0] == (seccomp.BPF_LD_W_ABS, 0, 0, seccomp.OFFSET_ARCH)
    assert code[1][0] == seccomp.BPF_JEQ_K and code[1][3] == seccomp.AUDIT_ARCH[arch]
    target = 1 + 1 + code[1][2]  # the false branch of the arch check
    assert code[target] == (seccomp.BPF_RET_K, 0, 0, seccomp.RET_KILL_PROCESS)
    assert len(code) < 4096  # BPF_MAXINSNS


@pytest.mark.parametrize("arch", sorted(seccomp.SYSCALLS))
def test_every_denied_number_leads_to_the_errno(arch: str) -> None:
    code = insns(seccomp.build(arch, deny_errno=MARK).assemble())
    table = seccomp.SYSCALLS[arch]
    for name in seccomp.DENIED:
        if name not in table:
            continue
        hits = [i for i, c in enumerate(code) if c[0] == seccomp.BPF_JEQ_K and c[3] == table[name]]
        assert hits, name
        pc = hits[0]
        assert code[pc + 1 + code[pc][1]] == (
            seccomp.BPF_RET_K, 0, 0, seccomp.RET_ERRNO | MARK
        ), name  # fmt: skip


def test_tables_know_every_denied_name() -> None:
    known = set().union(*(set(t) for t in seccomp.SYSCALLS.values()))
    assert set(seccomp.DENIED) <= known
    # The generic numbers (>= 424) are the same everywhere.
    x86, arm = seccomp.SYSCALLS["x86_64"], seccomp.SYSCALLS["aarch64"]
    assert all(arm[n] == v for n, v in x86.items() if v >= 424)


def test_assembler_refuses_backward_and_far_jumps() -> None:
    p = seccomp.Program()
    p.label("start")
    p.jump(seccomp.BPF_JEQ_K, 1, true="start")
    with pytest.raises(ValueError, match="out of range"):
        p.assemble()


def test_unknown_architecture_has_no_program() -> None:
    assert seccomp.filter_program("riscv64") is None


# --------------------------------------------------------------------- for real, under bwrap

PROBE = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
nr = json.loads(sys.argv[1])
def call(n, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(n), *[ctypes.c_ulong(a) for a in args])
    return r, ctypes.get_errno()
out = {}
for name in json.loads(sys.argv[2]):
    out[name] = call(nr[name], 0, 0, 0, 0, 0, 0)[1]
out["ioctl TIOCSTI"] = call(nr["ioctl"], 0, 0x5412, 0)[1]
out["ioctl TIOCSTI high bits"] = call(nr["ioctl"], 0, 0xFFFFFFFF00005412, 0)[1]
out["ioctl TIOCLINUX"] = call(nr["ioctl"], 0, 0x541C, 0)[1]
out["ioctl TCGETS"] = call(nr["ioctl"], 0, 0x5401, 0)[1]  # stdin is no tty: ENOTTY
out["clone CLONE_NEWUSER"] = call(nr["clone"], 0x10000000 | 17, 0, 0, 0, 0)[1]
out["clone3"] = call(nr["clone3"], 0, 0)[1]
out["personality ADDR_NO_RANDOMIZE"] = call(nr["personality"], 0x0040000)[1]
out["personality query"] = call(nr["personality"], 0xFFFFFFFF)[1]
out["getpid"] = call(nr.get("getpid", 39 if nr["ioctl"] == 16 else 172))[1]
import tempfile
d = tempfile.mkdtemp(dir="/tmp")
f = os.path.join(d, "f")
open(f, "w").close()
def errno_of(fn):
    try:
        fn()
        return 0
    except OSError as exc:
        return exc.errno
out["chmod u+s"] = errno_of(lambda: os.chmod(f, 0o4755))
out["chmod g+s"] = errno_of(lambda: os.chmod(f, 0o2755))
out["chmod 755"] = errno_of(lambda: os.chmod(f, 0o755))
out["open O_CREAT 04755"] = errno_of(lambda: os.open(f + "2", os.O_CREAT | os.O_WRONLY, 0o4755))
out["open O_CREAT 0644"] = errno_of(lambda: os.close(os.open(f + "3", os.O_CREAT, 0o644)))
out["mkdir 02775"] = errno_of(lambda: os.mkdir(d + "/sg", 0o2775))
out["mkdir 0755"] = errno_of(lambda: os.mkdir(d + "/plain", 0o755))
out["openat2"] = call(nr["openat2"], 0, 0, 0, 0)[1]
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(out))
"""


def under_bwrap(program: bytes, argv: list[str]) -> subprocess.CompletedProcess[str]:
    fd = os.memfd_create("filter")
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        bwrap = [bundled_bwrap(), "--unshare-all", "--die-with-parent", "--cap-drop", "ALL"]
        bwrap += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        return subprocess.run(
            [*bwrap, "--seccomp", str(fd), "--", *argv],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            start_new_session=True,
        )
    finally:
        os.close(fd)


@pytest.fixture
def arch() -> str:
    native = seccomp.native_arch()
    if native is None:
        pytest.skip("no syscall table for this architecture")
    return native


def test_denied_calls_get_the_errno_allowed_ones_work(arch: str) -> None:
    program = seccomp.filter_program(arch, deny_errno=MARK)
    assert program is not None
    table = dict(seccomp.SYSCALLS[arch])
    denied = [n for n in seccomp.DENIED if n in table]
    out = under_bwrap(program, ["python3", "-c", PROBE, json.dumps(table), json.dumps(denied)])
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    wrong = {n: e for n, e in seen.items() if n in denied and e != MARK}
    assert not wrong
    for name in ("ioctl TIOCSTI", "ioctl TIOCSTI high bits", "ioctl TIOCLINUX"):
        assert seen[name] == MARK, name
    assert seen["clone CLONE_NEWUSER"] == MARK
    assert seen["personality ADDR_NO_RANDOMIZE"] == MARK
    assert seen["clone3"] == seccomp.ENOSYS  # libc falls back to clone
    for name in ("chmod u+s", "chmod g+s", "open O_CREAT 04755", "mkdir 02775"):
        assert seen[name] == MARK, name
    assert seen["openat2"] == seccomp.ENOSYS
    for name in ("chmod 755", "open O_CREAT 0644", "mkdir 0755"):
        assert seen[name] == 0, name
    # Controls: the same calls with harmless arguments, and ordinary calls, still work.
    assert seen["ioctl TCGETS"] == 25  # ENOTTY: reached the kernel
    assert seen["personality query"] == 0
    assert seen["getpid"] == 0
    assert seen["fork"] == 7


def test_a_foreign_abi_call_kills_the_process(arch: str) -> None:
    if arch != "x86_64":
        pytest.skip("x32 numbering exists on x86_64 only")
    program = seccomp.filter_program(arch)
    assert program is not None
    x32_getpid = 0x40000000 | 39
    script = (
        "import ctypes, sys; print('before', flush=True); "
        f"ctypes.CDLL(None).syscall({x32_getpid}); print('after')"
    )
    out = under_bwrap(program, ["python3", "-c", script])
    assert out.stdout.split() == ["before"]
    assert out.returncode != 0
    control = under_bwrap(program, ["python3", "-c", "import os; print(os.getpid())"])
    assert control.returncode == 0 and control.stdout.strip()


def test_node_runs_under_the_filter(arch: str) -> None:
    """Agents are node programs: V8, libuv (io_uring off → thread pool), child processes."""
    found = shutil.which("node")
    if found is None:
        pytest.skip("no node on PATH")
    program = seccomp.filter_program(arch)
    assert program is not None
    script = (
        "const fs=require('fs');const cp=require('child_process');"
        "fs.writeFileSync('/dev/null','x');"
        "console.log(cp.execFileSync('sh',['-c','echo child']).toString().trim());"
        "fs.readFile('/etc/hostname',()=>console.log('async-fs'));"
    )
    out = under_bwrap(program, [str(found), "-e", script])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["child", "async-fs"]
