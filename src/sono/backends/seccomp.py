"""The seccomp filter bwrap installs on every process of a sandbox (``--seccomp FD``).

Modeled on Docker's default profile, written as a deny list: the system calls below
return ``EPERM`` (``clone3`` returns ``ENOSYS``: its flags sit behind a pointer a
filter cannot read, and libc then falls back to ``clone``, whose flags it can), every
other call is allowed. What it closes, and why each entry is here:

* the kernel keyrings (``keyctl``, ``add_key``, ``request_key``): a user namespace
  does not isolate them, so the sandbox could read the caller's session keyring;
* terminal injection: ``ioctl(TIOCSTI)`` pushes bytes into a terminal's input queue
  (a ``so shell`` shares the human's terminal), ``ioctl(TIOCLINUX)`` does the same on a
  virtual console; the request is compared on its low 32 bits, as the kernel reads it;
* new namespaces and mounts (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*``
  flag, the mount API old and new, ``pivot_root``): bwrap built the sandbox, nothing
  inside rebuilds it;
* kernel attack surface with no use for a coding agent: ``bpf``, ``perf_event_open``,
  ``userfaultfd``, ``io_uring_*`` (Docker blocks it since 25.0), kernel modules and
  kexec, swap, ``reboot``, ``acct``, the clock setters, ``syslog``, file handles
  (``open_by_handle_at``, the "shocker" escape), ``lookup_dcookie``, ``quotactl``,
  ``iopl``/``ioperm``, ``vhangup``, ``fanotify_init`` and obsolete calls (``uselib``,
  ``ustat``, ``sysfs``, ``_sysctl``, ``nfsservctl``, the old module calls);
* ``personality`` other than the values Docker allows (no ASLR switch-off, no
  ``READ_IMPLIES_EXEC``);
* other ABIs: a call made with a non-native architecture (i386 ``int 0x80`` or x32 on
  x86_64, arm32 on aarch64) kills the process — its numbers mean other calls, and the
  list above would not match them.

``ptrace`` stays allowed, as in Docker on kernels >= 4.8: the sandbox's own pid
namespace holds only its own processes, and debuggers are ordinary agent tools.

The program is built by a small assembler for classic BPF (:class:`Program`) and is
pure data: :func:`filter_program` returns the bytes bwrap reads.
"""

from __future__ import annotations

import platform
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

# <linux/audit.h>
AUDIT_ARCH: Mapping[str, int] = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000

# <linux/seccomp.h>
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000
EPERM = 1
ENOSYS = 38

# <linux/filter.h>: instruction classes and modes used here
BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
BPF_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
BPF_RET_K = 0x06  # BPF_RET | BPF_K

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
OFFSET_NR = 0
OFFSET_ARCH = 4


def arg_low(index: int) -> int:
    """Offset of the low 32 bits of syscall argument ``index`` (little-endian only)."""
    return 16 + 8 * index


# setuid/setgid bits: no call may set them (chmod) or create a file or directory with them
# (open/mkdir/mknod with a mode): the agent's uid is the caller's on bwrap, root's when so
# runs as root, and its files live on host paths (the upper layer, files.rw).
SET_ID_BITS = 0o6000
MODE_ARG = {  # syscall -> the index of its mode argument
    "chmod": 1,
    "fchmod": 1,
    "fchmodat": 2,
    "fchmodat2": 2,
    "creat": 1,
    "open": 2,
    "openat": 3,
    "mkdir": 1,
    "mkdirat": 2,
    "mknod": 1,
    "mknodat": 2,
}

TIOCSTI = 0x5412
TIOCLINUX = 0x541C
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
# CLONE_NEWPID | CLONE_NEWNET (CLONE_NEWTIME shares its bit with clone's exit signal).
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
CLONE_NAMESPACES |= 0x20000000 | 0x40000000
# Docker's allowed personas: PER_LINUX, PER_LINUX32, UNAME26, both, and the query.
PERSONAS_ALLOWED = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

DENIED: tuple[str, ...] = (
    # keyrings
    "keyctl",
    "add_key",
    "request_key",
    # namespaces and mounts
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "open_tree_attr",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # kernel surface
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "syslog",
    "open_by_handle_at",
    "name_to_handle_at",
    "lookup_dcookie",
    "quotactl",
    "quotactl_fd",
    "iopl",
    "ioperm",
    "vhangup",
    "fanotify_init",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "nfsservctl",
)

# Syscalls added since Linux 5.1 have the same number on every architecture.
UNIFIED = {
    "openat2": 437,
    "fchmodat2": 452,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
    "quotactl_fd": 443,
    "open_tree_attr": 467,
}

# Numbers from <asm/unistd_64.h> (x86_64) and <asm-generic/unistd.h> (aarch64); a name
# missing from an architecture's table does not exist there.
SYSCALLS: Mapping[str, Mapping[str, int]] = {
    "x86_64": {
        "open": 2,
        "mkdir": 83,
        "creat": 85,
        "chmod": 90,
        "fchmod": 91,
        "mknod": 133,
        "openat": 257,
        "mkdirat": 258,
        "mknodat": 259,
        "fchmodat": 268,
        "ioctl": 16,
        "clone": 56,
        "ptrace": 101,
        "syslog": 103,
        "uselib": 134,
        "personality": 135,
        "ustat": 136,
        "sysfs": 139,
        "vhangup": 153,
        "pivot_root": 155,
        "_sysctl": 156,
        "adjtimex": 159,
        "acct": 163,
        "settimeofday": 164,
        "mount": 165,
        "umount2": 166,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "iopl": 172,
        "ioperm": 173,
        "create_module": 174,
        "init_module": 175,
        "delete_module": 176,
        "get_kernel_syms": 177,
        "query_module": 178,
        "quotactl": 179,
        "nfsservctl": 180,
        "lookup_dcookie": 212,
        "clock_settime": 227,
        "kexec_load": 246,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "unshare": 272,
        "perf_event_open": 298,
        "fanotify_init": 300,
        "name_to_handle_at": 303,
        "open_by_handle_at": 304,
        "clock_adjtime": 305,
        "setns": 308,
        "finit_module": 313,
        "kexec_file_load": 320,
        "bpf": 321,
        "userfaultfd": 323,
        **UNIFIED,
    },
    "aarch64": {
        "mknodat": 33,
        "mkdirat": 34,
        "fchmod": 52,
        "fchmodat": 53,
        "openat": 56,
        "lookup_dcookie": 18,
        "ioctl": 29,
        "umount2": 39,
        "mount": 40,
        "pivot_root": 41,
        "nfsservctl": 42,
        "vhangup": 58,
        "quotactl": 60,
        "acct": 89,
        "personality": 92,
        "unshare": 97,
        "kexec_load": 104,
        "init_module": 105,
        "delete_module": 106,
        "clock_settime": 112,
        "syslog": 116,
        "ptrace": 117,
        "reboot": 142,
        "settimeofday": 170,
        "adjtimex": 171,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "clone": 220,
        "swapon": 224,
        "swapoff": 225,
        "perf_event_open": 241,
        "fanotify_init": 262,
        "name_to_handle_at": 264,
        "open_by_handle_at": 265,
        "clock_adjtime": 266,
        "setns": 268,
        "finit_module": 273,
        "bpf": 280,
        "userfaultfd": 282,
        "kexec_file_load": 294,
        **UNIFIED,
    },
}


@dataclass(frozen=True)
class Insn:
    """One classic BPF instruction (struct sock_filter); jumps are label names until
    :meth:`Program.assemble` resolves them to offsets."""

    code: int
    k: int = 0
    jt: str | None = None
    jf: str | None = None


@dataclass
class Program:
    """A tiny forward-only assembler: instructions and labels, each jump target a label
    defined later in the program (classic BPF jumps only forward)."""

    insns: list[Insn] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)

    def label(self, name: str) -> None:
        if name in self.labels:
            raise ValueError(f"label {name} defined twice")
        self.labels[name] = len(self.insns)

    def load(self, offset: int) -> None:
        self.insns.append(Insn(BPF_LD_W_ABS, offset))

    def jump(self, code: int, k: int, *, true: str | None = None, false: str | None = None) -> None:
        """``code`` (JEQ/JGE/JSET) against ``k``: to ``true`` or ``false`` (None: next)."""
        self.insns.append(Insn(code, k, true, false))

    def ret(self, k: int) -> None:
        self.insns.append(Insn(BPF_RET_K, k))

    def assemble(self) -> bytes:
        out = bytearray()
        for pc, insn in enumerate(self.insns):
            jt, jf = self._offset(pc, insn.jt), self._offset(pc, insn.jf)
            out += struct.pack("=HBBI", insn.code, jt, jf, insn.k & 0xFFFFFFFF)
        return bytes(out)

    def _offset(self, pc: int, target: str | None) -> int:
        if target is None:
            return 0
        offset = self.labels[target] - pc - 1
        if not 0 <= offset <= 255:
            raise ValueError(f"jump from {pc} to {target} out of range ({offset})")
        return offset


def native_arch() -> str | None:
    """This machine's architecture if the filter knows it (x86_64, aarch64), else None."""
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return arch if arch in SYSCALLS and sys.byteorder == "little" else None


def build(arch: str, *, deny_errno: int = EPERM) -> Program:
    """The filter for ``arch`` as a :class:`Program` (see the module docstring);
    ``deny_errno`` is what denied calls return (tests pick one no kernel path returns)."""
    table = SYSCALLS[arch]
    p = Program()
    p.load(OFFSET_ARCH)
    p.jump(BPF_JEQ_K, AUDIT_ARCH[arch], false="kill")
    p.load(OFFSET_NR)
    if arch == "x86_64":
        p.jump(BPF_JGE_K, X32_SYSCALL_BIT, true="kill")
    for name in DENIED:
        if name in table:
            p.jump(BPF_JEQ_K, table[name], true="deny")
    p.jump(BPF_JEQ_K, table["ioctl"], true="ioctl")
    p.jump(BPF_JEQ_K, table["clone"], true="clone")
    p.jump(BPF_JEQ_K, table["clone3"], true="enosys")
    p.jump(BPF_JEQ_K, table["personality"], true="personality")
    p.jump(BPF_JEQ_K, table["openat2"], true="enosys")  # its mode sits in a struct
    for name, index in MODE_ARG.items():
        if name in table:
            p.jump(BPF_JEQ_K, table[name], true=f"mode{index}")
    p.ret(RET_ALLOW)
    for index in sorted(set(MODE_ARG.values())):
        p.label(f"mode{index}")  # the mode is an unsigned int
        p.load(arg_low(index))
        p.jump(BPF_JSET_K, SET_ID_BITS, true="deny")
        p.ret(RET_ALLOW)
    p.label("ioctl")  # ioctl(fd, request): the request is an unsigned int
    p.load(arg_low(1))
    p.jump(BPF_JEQ_K, TIOCSTI, true="deny")
    p.jump(BPF_JEQ_K, TIOCLINUX, true="deny")
    p.ret(RET_ALLOW)
    p.label("clone")  # clone(flags, ...) on both architectures
    p.load(arg_low(0))
    p.jump(BPF_JSET_K, CLONE_NAMESPACES, true="deny")
    p.ret(RET_ALLOW)
    p.label("personality")
    p.load(arg_low(0))
    for persona in PERSONAS_ALLOWED:
        p.jump(BPF_JEQ_K, persona, true="allow")
    p.label("deny")
    p.ret(RET_ERRNO | deny_errno)
    p.label("enosys")
    p.ret(RET_ERRNO | ENOSYS)
    p.label("kill")
    p.ret(RET_KILL_PROCESS)
    p.label("allow")
    p.ret(RET_ALLOW)
    return p


def filter_program(arch: str | None = None, *, deny_errno: int = EPERM) -> bytes | None:
    """The assembled filter (struct sock_filter array) for ``arch`` (default: this
    machine), or None on an architecture without a syscall table here."""
    arch = arch or native_arch()
    if arch is None or arch not in SYSCALLS:
        return None
    return build(arch, deny_errno=deny_errno).assemble()
