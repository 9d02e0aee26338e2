"""Can a microVM boot here: each host situation faked under a root directory."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from sono.kvm import Runtime, boot_support, cpu_flags, find_runtime, loaded_modules

PVM_REASON = (
    "/dev/kvm exists but comes from kvm_pvm (paravirtual KVM without VT-x/AMD-V): "
    "libkrunfw's guest kernel cannot boot under its instruction emulator"
)


def host(
    root: Path,
    *,
    kvm: bool = True,
    proc_modules: Sequence[str] = (),
    sys_modules: Sequence[str] = (),
    flags: Sequence[str] = ("fpu", "sse2"),
) -> Path:
    (root / "proc").mkdir(parents=True)
    if kvm:
        (root / "dev").mkdir()
        (root / "dev" / "kvm").write_text("")
    if proc_modules:
        lines = [f"{m} 1327104 0 - Live 0x0000000000000000" for m in proc_modules]
        (root / "proc" / "modules").write_text("\n".join(lines) + "\n")
    for name in sys_modules:
        (root / "sys" / "module" / name / "parameters").mkdir(parents=True)
    cpu = "".join(f"processor\t: {n}\nflags\t\t: {' '.join(flags)}\n\n" for n in (0, 1))
    (root / "proc" / "cpuinfo").write_text(cpu)
    return root


def runtime(tmp_path: Path, *, msb: bool = True, lib: bool = True) -> Runtime:
    bin_dir = tmp_path / "rt" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "msb").write_text("")
    (tmp_path / "rt" / "lib").mkdir(exist_ok=True)
    (tmp_path / "rt" / "lib" / "libkrunfw.so.5").write_text("")
    return Runtime(
        bin_dir / "msb" if msb else None,
        tmp_path / "rt" / "lib" / "libkrunfw.so.5" if lib else None,
        str(tmp_path / "rt"),
    )


def test_no_dev_kvm(tmp_path: Path) -> None:
    root = host(tmp_path / "h", kvm=False, proc_modules=["kvm"], flags=["vmx"])
    s = boot_support(root, runtime=lambda: runtime(tmp_path), system="Linux")
    assert not s.ok
    assert s.reason.startswith("no /dev/kvm: this host offers no KVM")


def test_kvm_pvm_as_here_only_in_sys_module(tmp_path: Path) -> None:
    """This machine: no /proc/modules, kvm and kvm_pvm under /sys/module, no vmx."""
    root = host(tmp_path / "h", sys_modules=["kvm", "kvm_pvm"], flags=["fpu", "hypervisor"])
    s = boot_support(root, runtime=lambda: runtime(tmp_path), system="Linux")
    assert not s.ok and s.reason == PVM_REASON


def test_kvm_pvm_in_proc_modules(tmp_path: Path) -> None:
    root = host(tmp_path / "h", proc_modules=["kvm_pvm", "kvm"], flags=["vmx"])
    s = boot_support(root, runtime=lambda: runtime(tmp_path), system="Linux")
    assert not s.ok and s.reason == PVM_REASON


@pytest.mark.parametrize(("module", "flag"), [("kvm_intel", "vmx"), ("kvm_amd", "svm")])
def test_hardware_kvm_with_runtime_boots(tmp_path: Path, module: str, flag: str) -> None:
    root = host(tmp_path / "h", proc_modules=[module, "kvm"], flags=["fpu", flag])
    rt = runtime(tmp_path)
    s = boot_support(root, runtime=lambda: rt, system="Linux")
    assert s.ok, s.reason
    assert f"/dev/kvm from {module} with {flag}" in s.reason and str(rt.msb) in s.reason


def test_runtime_missing(tmp_path: Path) -> None:
    root = host(tmp_path / "h", proc_modules=["kvm_intel", "kvm"], flags=["vmx"])
    s = boot_support(root, runtime=lambda: runtime(tmp_path, msb=False), system="Linux")
    assert not s.ok
    assert s.reason.startswith("the microsandbox runtime is missing: no msb binary")
    assert "pip install microsandbox==" in s.reason


def test_runtime_without_libkrunfw(tmp_path: Path) -> None:
    root = host(tmp_path / "h", proc_modules=["kvm_amd"], flags=["svm"])
    s = boot_support(root, runtime=lambda: runtime(tmp_path, lib=False), system="Linux")
    assert not s.ok and "no libkrunfw next to it" in s.reason


def test_kvm_without_hardware_virtualization(tmp_path: Path) -> None:
    """A /dev/kvm whose module cannot be told, on a CPU without vmx/svm (a VM)."""
    root = host(tmp_path / "h", flags=["fpu", "hypervisor"])
    s = boot_support(root, runtime=lambda: runtime(tmp_path), system="Linux")
    assert not s.ok
    assert "no vmx/svm flag" in s.reason and "without nested virtualization" in s.reason


@pytest.mark.skipif(os.getuid() == 0, reason="root may open any file: access is not judged")
def test_dev_kvm_not_accessible(tmp_path: Path) -> None:
    root = host(tmp_path / "h", proc_modules=["kvm_intel"], flags=["vmx"])
    (root / "dev" / "kvm").chmod(0)
    s = boot_support(root, runtime=lambda: runtime(tmp_path), system="Linux")
    assert not s.ok and "not readable and writable" in s.reason


def test_macos(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    apple = boot_support(tmp_path, runtime=lambda: rt, system="Darwin", machine="arm64")
    assert apple.ok and "Apple Silicon" in apple.reason
    intel = boot_support(tmp_path, runtime=lambda: rt, system="Darwin", machine="x86_64")
    assert not intel.ok and "Apple Silicon only" in intel.reason
    other = boot_support(tmp_path, runtime=lambda: rt, system="Windows", machine="AMD64")
    assert not other.ok


def test_modules_and_flags_readers(tmp_path: Path) -> None:
    root = host(
        tmp_path / "h",
        proc_modules=["kvm_intel", "ext4"],
        sys_modules=["kvm"],
        flags=["vmx", "hypervisor"],
    )
    assert loaded_modules(root) == {"kvm", "kvm_intel"}
    assert {"vmx", "hypervisor"} <= cpu_flags(root)


def test_find_runtime_honours_msb_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rt = runtime(tmp_path)
    assert rt.msb is not None
    monkeypatch.setenv("MSB_PATH", str(rt.msb))
    monkeypatch.delenv("MSB_LIBKRUNFW_PATH", raising=False)
    found = find_runtime()
    assert found.msb == rt.msb and found.libkrunfw == rt.libkrunfw
    monkeypatch.setenv("MSB_PATH", str(tmp_path / "nowhere" / "msb"))
    assert find_runtime().msb is None


def test_find_runtime_finds_the_bundled_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned wheel bundles msb and libkrunfw (a dependency of so)."""
    monkeypatch.delenv("MSB_PATH", raising=False)
    monkeypatch.delenv("MSB_LIBKRUNFW_PATH", raising=False)
    found = find_runtime()
    assert found.msb is not None and found.msb.name == "msb"
    assert found.libkrunfw is not None and found.libkrunfw.name.startswith("libkrunfw")


def test_this_host_has_a_precise_answer() -> None:
    s = boot_support()
    assert s.reason  # whatever the host: a reason to print, never an empty one
    if Path("/sys/module/kvm_pvm").is_dir() and not Path("/sys/module/kvm_intel").is_dir():
        assert not s.ok and s.reason == PVM_REASON
