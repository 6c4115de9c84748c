"""A small seccomp-BPF filter for the bwrap sandbox (`bwrap --seccomp FD` loads it before the program starts).

It makes these system calls fail (EPERM, ENOSYS for clone3) for the program and everything it starts:
  new user namespaces   unshare/clone with CLONE_NEWUSER; clone3 (its flags sit in memory a filter cannot read, so
                        it answers ENOSYS and the C library falls back to clone), setns
  unbounded memory      memfd_create, memfd_secret (shmem that RLIMIT_AS does not count); System V IPC: shmget
                        (segments outlive their mapping), semget and msgget (semaphore sets and queued messages are
                        kernel memory outside every cap: 160 MB of each under a 256 MB RLIMIT_AS before this);
                        POSIX message queues: mq_open. Denying the calls that create an object is enough: the IPC
                        namespace is new, so there is no object to attach to.
  reading other processes ptrace, process_vm_readv, process_vm_writev (the harness's secret; see harness.py)
  kernel attack surface userfaultfd, bpf, perf_event_open, keyctl, add_key, request_key, io_uring_setup
  file locks            flock, and fcntl's F_SETLK/F_SETLKW/F_OFD_SETLK/F_OFD_SETLKW/F_SETLEASE: a lock on a read-only
                        host file (the Python installation is visible) was a channel between concurrent sandboxes
  file notifications    inotify_init, inotify_init1, fanotify_init and fcntl's F_NOTIFY: a watch on a read-only host
                        file sees another sandbox open it (2,048 bits in 0.11 s between two concurrent sandboxes)
Any system call made through another ABI (32-bit `int 0x80` on x86-64, x32) fails with ENOSYS, so the numbers above
cannot be bypassed. Only x86-64 and aarch64 are known; elsewhere `build()` returns None (documented, no filter).
"""

from __future__ import annotations

import platform
import struct

__all__ = ["build", "CLONE_NEWUSER"]

CLONE_NEWUSER = 0x10000000
_EPERM, _ENOSYS = 1, 38

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000

# seccomp_data: int nr (0); u32 arch (4); u64 ip (8); u64 args[6] (16...): args[0]'s low word is at 16 (little endian)
_NR, _ARCH, _ARG0_LO, _ARG1_LO = 0, 4, 16, 24
_FCNTL_DENIED = (6, 7, 37, 38, 1024, 1026)  # F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_NOTIFY

_DENIED = ("memfd_create", "memfd_secret", "shmget", "semget", "msgget", "mq_open", "setns", "ptrace",
           "process_vm_readv", "process_vm_writev", "userfaultfd", "bpf", "perf_event_open", "keyctl", "add_key",
           "request_key", "io_uring_setup", "flock",
           "inotify_init", "inotify_init1", "fanotify_init")  # a name an architecture lacks is skipped there
# machine -> (AUDIT_ARCH, syscall numbers, first number of another ABI on the same arch or None)
_ARCHES: dict[str, tuple[int, dict[str, int], int | None]] = {
    "x86_64": (0xC000003E, {
        "memfd_create": 319, "memfd_secret": 447, "shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240,
        "clone": 56, "clone3": 435, "unshare": 272,
        "setns": 308, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "userfaultfd": 323,
        "bpf": 321, "perf_event_open": 298, "keyctl": 250, "add_key": 248, "request_key": 249,
        "io_uring_setup": 425, "flock": 73, "fcntl": 72, "inotify_init": 253, "inotify_init1": 294,
        "fanotify_init": 300}, 0x40000000),  # __X32_SYSCALL_BIT
    "aarch64": (0xC00000B7, {
        "memfd_create": 279, "memfd_secret": 447, "shmget": 194, "semget": 190, "msgget": 186, "mq_open": 180,
        "clone": 220, "clone3": 435, "unshare": 97,
        "setns": 268, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "userfaultfd": 282,
        "bpf": 280, "perf_event_open": 241, "keyctl": 219, "add_key": 217, "request_key": 218,
        "io_uring_setup": 425, "flock": 32, "fcntl": 25, "inotify_init1": 26, "fanotify_init": 262}, None),
}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build(machine: str | None = None) -> bytes | None:
    """The filter as raw `struct sock_filter` instructions (what bwrap --seccomp reads), or None on an unknown
    architecture. machine: platform.machine() by default."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, nr, other_abi = arch
    prog: list[bytes] = [_insn(_LD_W_ABS, _ARCH), _insn(_JEQ_K, audit_arch, jt=1), _insn(_RET_K, _ERRNO | _ENOSYS),
                         _insn(_LD_W_ABS, _NR)]
    if other_abi is not None:
        prog += [_insn(_JGE_K, other_abi, jf=1), _insn(_RET_K, _ERRNO | _ENOSYS)]
    for name in (n for n in _DENIED if n in nr):
        prog += [_insn(_JEQ_K, nr[name], jf=1), _insn(_RET_K, _ERRNO | _EPERM)]
    prog += [_insn(_JEQ_K, nr["clone3"], jf=1), _insn(_RET_K, _ERRNO | _ENOSYS)]
    # clone and unshare: deny when CLONE_NEWUSER is set in the flags (args[0] for both, on both architectures)
    prog += [_insn(_JEQ_K, nr["clone"], jt=1), _insn(_JEQ_K, nr["unshare"], jf=3),
             _insn(_LD_W_ABS, _ARG0_LO), _insn(_JSET_K, CLONE_NEWUSER, jf=1), _insn(_RET_K, _ERRNO | _EPERM)]
    # fcntl: deny the lock and notification commands (args[1]); the number is loaded again (the clone check may
    # have loaded args[0]). Each command jumps to the deny at the end of the block; the last falls through to allow.
    cmds = _FCNTL_DENIED
    prog += [_insn(_LD_W_ABS, _NR), _insn(_JEQ_K, nr["fcntl"], jf=len(cmds) + 2), _insn(_LD_W_ABS, _ARG1_LO)]
    prog += [_insn(_JEQ_K, c, jt=len(cmds) - 1 - k) for k, c in enumerate(cmds[:-1])]
    prog += [_insn(_JEQ_K, cmds[-1], jf=1), _insn(_RET_K, _ERRNO | _EPERM)]
    prog.append(_insn(_RET_K, _ALLOW))
    return b"".join(prog)
