"""CPU kernels that XLA:CPU lacks, built from C++ source at first use and called as XLA FFI targets.

One so far: `packed_matmul`, a float32 matmul for a few rows against a weight stored in 16-column
blocks (`pack`). A decode step is such matmuls over every weight; XLA:CPU's dot kernels stream a
[K, N] weight at about a third of this machine's read bandwidth for 16 rows, the packed kernel at
about 60% of it (`benchmarks/dots.py`, docs/benchmarks.md). The sampler uses it for its decode
loop on a CPU (`SamplingConfig.cpu_kernel`).

The library is compiled with the host C++ compiler (`$CXX`, else c++/g++/clang++) and
`-O3 -march=native` (`$SPADE_JAX_KERNEL_ARCH` replaces `native`) against jaxlib's FFI headers, cached
under `$SPADE_JAX_CACHE` (default `~/.cache/spade_jax/kernels`) by a hash of the source, compiler,
jaxlib and CPU. Without a compiler, or if the build fails, `available()` is False with the reason
in `unavailable_reason()` and callers keep XLA's own dot.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib

LANES = 16  # columns per packed block (one 512-bit vector of float32)
_SOURCE = Path(__file__).with_name("packed_matmul.cc")
_TARGET = "spade_packed_matmul"
_lock = threading.Lock()
_state: dict = {}  # "lib" -> CDLL once built and registered, or "error" -> why not


def _cache_dir() -> Path:
    root = os.environ.get("SPADE_JAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "spade_jax")
    return Path(root) / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _cpu_id() -> str:
    """What -march=native depends on: the CPU model and its feature flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        keep = [line for line in info.splitlines() if line.startswith(("model name", "flags", "Features"))]
        return "\n".join(sorted(set(keep)))
    except OSError:
        return platform.processor() or platform.machine()


def _flags() -> list[str]:
    arm = platform.machine().lower() in ("arm64", "aarch64")
    target = os.environ.get("SPADE_JAX_KERNEL_ARCH", "native")  # e.g. x86-64-v3: an AVX2 build
    arch = f"-mcpu={target}" if arm else f"-march={target}"
    return ["-O3", arch, "-std=c++17", "-shared", "-fPIC", "-w", f"-I{jax.ffi.include_dir()}"]


def _build() -> Path:
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX or install g++/clang++)")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join(
        [_SOURCE.read_text(), cxx, version, jaxlib.__version__, _cpu_id(), " ".join(_flags())]
    ).encode()).hexdigest()[:16]
    out = _cache_dir() / f"packed_matmul-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)  # rename: concurrent builders never see half a file
    os.close(fd)
    try:
        done = subprocess.run([cxx, *_flags(), str(_SOURCE), "-o", tmp], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(cxx).name} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _load() -> ctypes.CDLL | None:
    with _lock:
        if not _state:
            try:
                lib = ctypes.cdll.LoadLibrary(str(_build()))
                jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(lib.SpadePackedMatmul), platform="cpu")
                lib.SpadePackedMatmulVectorBits.restype = ctypes.c_int
                _state["lib"] = lib
            except (OSError, RuntimeError, AttributeError) as e:
                _state["error"] = f"{type(e).__name__}: {e}"
        return _state.get("lib")


def available() -> bool:
    """Whether `packed_matmul` can run here (builds the library on the first call)."""
    return _load() is not None


def unavailable_reason() -> str | None:
    _load()
    return _state.get("error")


def vector_bits() -> int:
    """The SIMD width the library was compiled for (512 with AVX-512, 256 with AVX/AVX2, else 128)."""
    lib = _load()
    return 0 if lib is None else int(lib.SpadePackedMatmulVectorBits())


def preferred() -> bool:
    """Whether `packed_matmul` should replace XLA's dot for decode steps here: a CPU backend and a
    build with 256- or 512-bit vectors (AVX2 / AVX-512). Both builds measured 1.5-1.6x XLA's
    AVX-512 dots on an AVX-512 machine (docs/benchmarks.md); 128-bit builds (NEON, SSE) are
    unmeasured, so they keep XLA's dot."""
    return jax.default_backend() == "cpu" and available() and vector_bits() >= 256


def packable(k: int, n: int) -> bool:
    """Whether a [k, n] weight can be packed (and then must go through `packed_matmul`)."""
    return k > 0 and n > 0 and n % LANES == 0


def pack(w_kn: jax.Array) -> jax.Array:
    """[K, N] -> [N / 16, K, 16]: column block b of w as one contiguous [K, 16] stream."""
    k, n = w_kn.shape
    return w_kn.reshape(k, n // LANES, LANES).transpose(1, 0, 2)


def pack_rows(w_nk: jax.Array) -> jax.Array:
    """[N, K] (a weight contracted on its last axis, like a tied embedding) -> [N / 16, K, 16]."""
    n, k = w_nk.shape
    return w_nk.reshape(n // LANES, LANES, k).transpose(0, 2, 1)


def packed_matmul(x: jax.Array, w_packed: jax.Array) -> jax.Array:
    """x [..., K] float32 @ the [K, N] weight that `pack` turned into `w_packed` [N / 16, K, 16]."""
    if _load() is None:
        raise RuntimeError(f"the packed matmul kernel is unavailable: {unavailable_reason()}")
    blocks, k, lanes = w_packed.shape
    if lanes != LANES or x.shape[-1] != k or x.dtype != jnp.float32 or w_packed.dtype != jnp.float32:
        raise ValueError(f"packed_matmul: x {x.shape} {x.dtype} against packed {w_packed.shape} {w_packed.dtype}")
    rows = x.reshape(-1, k)
    out = jax.ffi.ffi_call(_TARGET, jax.ShapeDtypeStruct((rows.shape[0], blocks * LANES), jnp.float32))(rows, w_packed)
    return out.reshape(*x.shape[:-1], blocks * LANES)
