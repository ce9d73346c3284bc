"""Kernel speed: ``python -m gguflm.bench kernels [--quick] [options]``.

For weight matrices shaped like the real models' (rows x cols) it prints the GB/s of weight
streamed by a single-token matvec at each thread count, and the GFLOP/s of a batch of tokens,
beside the machine's measured memory read bandwidth (a parallel read-sum over a large buffer) and
its measured int8 peak: a plain loop of independent multiply-adds of the ISA the batch kernels run
(AVX-512 VNNI's vpdpbusd, or AVX2's vpmaddubsw + vpmaddwd) on the batch's thread count. A batch
matmul's GFLOP/s counts 2 operations per weight x activation product, as the peak does, so
``%peak`` is the share of the int8 units the kernel keeps busy (the float epilogues and the
weights' decoding take the rest). Where the AMX tiles are on (the CPU has AMX-INT8, the OS enables
the tile state and the kernel granted it: :func:`gguflm.system.amx`), the AMX int8 peak (a loop of
full-size tdpbssd tiles) is measured too, and the rows whose batch kernel takes its integer dots
from the tiles (the repacked Q4_0 recipe's: Q4_0, IQ4_NL, MXFP4; TILED's of the types of 32-element
sub-blocks: Q4_K, Q5_K, IQ4_XS, IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S) are measured against it (``%peak``
marked ``a``); elsewhere the bench says why there is no AMX figure.
K-quant matrices need whole 256-element blocks per row, so their column counts are rounded up to
a multiple of 256 (640 -> 768, 576 -> 768); the label says so. Q4_0, IQ4_NL and MXFP4 matrices
whose rows come in whole groups of 16 are measured in the rows-16 layout a loaded model holds them
in (label ``r``).

With ``--compare llama-cpp`` each row is also computed by llama.cpp's own ggml-cpu, from the
libraries llama-cpp-python ships (:mod:`gguflm.bench.ggml_peer`): the same weights in the file's
layout, held where llama.cpp holds a model weight (its CPU_REPACK buffer for the types it
repacks), ``ggml_mul_mat`` nodes of one graph computed on the same thread counts (8 nodes a
graph for the single token, so that its one thread start a graph weighs as little as in a model's
graph): the GB/s of its single-token matvec and the GFLOP/s of its batch, beside gguflm's.

:func:`run` returns the figures as a dict, so the ``gguflm bench`` CLI can reuse it.

On a shared machine the bandwidth and the peak drift (2x within minutes was seen on a 2-core
cloud machine), and a busy neighbour only ever lowers them, so they are measured again after each
row and each row's ``%read`` and ``%peak`` are against the highest figures measured so far: a
lower bound of the row's share. (Against figures from the row's own few seconds instead, a kernel
that caught a faster moment than its peak loop read over 100%.)

On a machine shared with other busy processes, libgomp's default spin-waiting makes every
multi-threaded parallel region wait for a time slice (about 10 ms per matmul was measured on a
2-core machine under load); run with ``OMP_WAIT_POLICY=passive`` there. The variable has to be set
before the process loads the OpenMP runtime, so it cannot be set from inside this module.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import gguflm.quants as q
from gguflm import system
from gguflm._ext import quants as _k
from gguflm.bench import llama_cpp_or_none
from gguflm.testing import random_blocks

TYPES = ["Q4_K", "Q8_0", "Q6_K", "Q5_0", "Q4_1", "IQ4_NL", "IQ4_XS", "MXFP4", "TQ1_0", "TQ2_0",
         "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]
SHAPES = [(262144, 640), (2048, 640), (640, 2048), (1536, 576)]


def _best_seconds(fn, repeat: int, min_seconds: float = 0.0, clock=time.perf_counter) -> float:
    """Best time of ``fn()`` on ``clock`` over ``repeat`` runs (more while under ``min_seconds``
    of wall time in total)."""
    best, total, runs = float("inf"), 0.0, 0
    while runs < repeat or (total < min_seconds and runs < 50 * repeat):
        w0, t0 = time.perf_counter(), clock()
        fn()
        best = min(best, clock() - t0)
        total, runs = total + time.perf_counter() - w0, runs + 1
    return best


def read_buffer(n_bytes: int) -> np.ndarray:
    """The buffer read_bandwidth sums, written once so every page is resident."""
    return np.ones(n_bytes // 8, dtype=np.uint64)


def read_bandwidth(buf: np.ndarray, n_threads: int, repeat: int = 3) -> float:
    """Measured memory read bandwidth in GB/s: a parallel sum of ``buf``'s 64-bit words."""
    seconds = _best_seconds(lambda: _k.read_sum(buf, n_threads), repeat)
    return buf.nbytes / seconds / 1e9


def _batch_clock(n_threads: int):
    """One thread: the thread's CPU clock (OpenMP runs a team of one on the calling thread), which
    other processes on a shared machine do not distort; more: wall time."""
    return time.thread_time if n_threads == 1 else time.perf_counter


def int8_peak(n_threads: int, seconds: float = 0.2, repeat: int = 3, amx: bool = False) -> float | None:
    """Measured int8 peak in GOP/s (2 per multiply-add) of the current ISA's loop on ``n_threads``
    threads (amx: of the AMX tiles' loop), best of ``repeat`` runs of about ``seconds`` each; None
    for the scalar ISA, and with amx where the tiles are off."""
    iters = 1 << 10 if amx else 1 << 16
    while True:  # grow the round count until one run takes a measurable time
        t0 = time.perf_counter()
        ops = _k.int8_peak(iters, n_threads, amx)
        took = time.perf_counter() - t0
        if ops == 0:
            return None
        if took >= seconds / 4 or iters >= 1 << 34:
            break
        iters *= 4
    best = _best_seconds(lambda: _k.int8_peak(iters, n_threads, amx), repeat, clock=_batch_clock(n_threads))
    return ops / best / 1e9


def _references(buf: np.ndarray, n_threads: int, batch_threads: int) -> tuple[float, float, float]:
    """The read bandwidth (``n_threads``), the int8 peak and the AMX one (``batch_threads``; 0
    without one), measured again briefly."""
    return (read_bandwidth(buf, n_threads, repeat=2), int8_peak(batch_threads, seconds=0.1, repeat=2) or 0.0,
            int8_peak(batch_threads, seconds=0.1, repeat=2, amx=True) or 0.0)


def amx_status() -> str:
    """What the CPU, the OS and the kernel say about AMX, and whether the kernels use it."""
    amx = system.system_info().get("amx", {})
    if not amx.get("cpu"):
        return "AMX: not on this CPU"
    if not amx.get("os") or not amx.get("permitted"):
        return "AMX: on the CPU, but the OS/kernel does not grant the tile state"
    if not amx.get("on"):
        return "AMX: granted, but switched off (GGUFLM_AMX=0 or gguflm.system.set_amx)"
    if not system.current_isa().startswith("avx512"):
        return f"AMX: granted, but the {system.current_isa()} kernels do not use it"
    return ("AMX: granted and on: the batch tiles of the repacked Q4_0 recipe (Q4_0, IQ4_NL, MXFP4) and of TILED's "
            "32-element sub-blocks (Q4_K, Q5_K, IQ4_XS, IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S) use it")


def _weights(fmt: q.Format, n_rows: int, n_cols: int, rng: np.random.Generator) -> np.ndarray:
    return random_blocks(fmt, n_rows * n_cols // fmt.block_size, rng).reshape(n_rows, -1)


def _ggml_seconds(fmt: q.Format, w: np.ndarray, x: np.ndarray, n_threads: int, repeat: int, nodes: int,
                  warm: bool) -> float:
    """Best seconds of one ggml_mul_mat of llama.cpp's ggml-cpu: w in the file's layout, x float32
    [n_tok, cols]; ``nodes`` of them in a graph, best of ``repeat`` computes (after one more
    where ``warm``)."""
    from gguflm.bench import ggml_peer

    with ggml_peer.mul_mat_graph(int(fmt.type), w, x.shape[1], x, n_threads, nodes=nodes,
                                 computes=repeat + warm) as (compute, _):
        if warm:
            compute()
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            compute()
            best = min(best, time.perf_counter() - t0)
    return best / nodes


def run(types: list[str] = TYPES, shapes: list[tuple[int, int]] = SHAPES, threads: list[int] = [1, 2],
        batch: int = 512, batch_threads: int = 2, membw_bytes: int = 1 << 30, repeat: int = 5,
        compare: bool = False, out=print) -> dict:
    """Measure and print; returns ``{"isa", "arithmetic", "read_gbs": {threads: GB/s}, "int8_peak_gops",
    "amx_peak_gops", "rows": [...]}`` (a row's ``peak_share``: its batch GFLOP/s over the int8 peak
    of what its batch ran, the AMX one where its ``amx`` is true; None without one; with
    ``compare``, its ``ggml_gbs`` and ``ggml_gflops``: llama.cpp's ggml-cpu on the same weights,
    single token on max(threads) threads, batch on batch_threads)."""
    rng = np.random.default_rng(0)
    results = {"isa": system.current_isa(), "arithmetic": system.current_arithmetic(), "read_gbs": {}, "rows": []}
    out(f"kernels: {system.current_isa()}, arithmetic {system.current_arithmetic()}")
    buf = read_buffer(membw_bytes)
    for n in threads:
        results["read_gbs"][n] = read_bandwidth(buf, n)
        out(f"memory read bandwidth, {n} thread(s): {results['read_gbs'][n]:.1f} GB/s "
            f"({membw_bytes / 2**20:.0f} MiB buffer)")
    peak = results["int8_peak_gops"] = int8_peak(batch_threads)
    if peak is None:
        out("int8 peak: none (scalar kernels)")
    else:
        kind = "vpdpbusd (AVX-512 VNNI)" if system.current_isa().startswith("avx512") else "vpmaddubsw+vpmaddwd (AVX2)"
        out(f"int8 peak, {batch_threads} thread(s): {peak:.1f} GOP/s ({kind} loop)")
    out(amx_status())
    amx_peak = results["amx_peak_gops"] = int8_peak(batch_threads, amx=True)
    if amx_peak is not None:
        out(f"AMX int8 peak, {batch_threads} thread(s): {amx_peak:.1f} GOP/s (tdpbssd loop, 16x16x64 tiles)")
    best_read, best_peak, best_amx = results["read_gbs"][max(threads)], peak, amx_peak
    header = f"{'type':6} {'rows x cols':>14} {'GB/s 1t cpu':>11} " + " ".join(f"{f'GB/s {n}t':>9}" for n in threads)
    batch_label = f"GFLOP/s b{batch} {batch_threads}t" + (" cpu" if batch_threads == 1 else "")
    out(header + f" {f'%read {max(threads)}t':>9} {batch_label:>18} {'%peak':>6}"
        + (f" {f'llama.cpp GB/s {max(threads)}t':>18} {'llama.cpp GFLOP/s':>17}" if compare else ""))
    for name in types:
        fmt = q.get(name)
        for n_rows, n_cols in shapes:
            cols = -(-n_cols // fmt.block_size) * fmt.block_size
            w = w_file = _weights(fmt, n_rows, cols, rng)
            # held as a loaded model holds it: in the rows-16 layout where the type and rows allow,
            # in another type's blocks where the type has one (the bytes streamed are those)
            rows16 = fmt.type in q.ROWS16_TYPES and n_rows % q.ROWS16 == 0
            kernel_type = q.HELD_AS.get(fmt.type, fmt.type)
            if rows16:
                w = q.to_rows16(w, fmt.type)
            elif kernel_type != fmt.type:
                w = q.hold_as(w, fmt.type)
            x1 = rng.standard_normal((1, cols)).astype(np.float32)
            out1 = np.empty((1, n_rows), np.float32)
            row = {"type": name, "rows": n_rows, "cols": cols, "weight_bytes": w.nbytes, "gbs": {}, "rows16": rows16,
                   "held_as": None if kernel_type == fmt.type else kernel_type.name,
                   "amx": batch >= 16 and _k.amx_batch(int(kernel_type), n_rows, cols, q.matmul_storage(kernel_type, rows16=rows16))}

            def matmul(x: np.ndarray, out: np.ndarray, n_threads: int) -> None:
                q.matmul(w, kernel_type, x, out=out, n_threads=n_threads, rows16=rows16)

            # single thread on the thread's CPU clock: what the kernel streams while it runs, which
            # other processes on a shared machine do not distort the way they distort wall time
            secs = _best_seconds(lambda: matmul(x1, out1, 1), repeat, 0.2, time.thread_time)
            row["gbs_cpu"] = w.nbytes / secs / 1e9
            for n in threads:
                secs = _best_seconds(lambda: matmul(x1, out1, n), repeat, 0.2)
                row["gbs"][n] = w.nbytes / secs / 1e9
            xb = rng.standard_normal((batch, cols)).astype(np.float32)
            outb = np.empty((batch, n_rows), np.float32)
            secs = _best_seconds(lambda: matmul(xb, outb, batch_threads),
                                 1 if w.nbytes > 2**26 else repeat, clock=_batch_clock(batch_threads))
            row["gflops"] = 2.0 * n_rows * cols * batch / secs / 1e9
            read_gbs, peak_gops, amx_gops = _references(buf, max(threads), batch_threads)
            best_read = row["read_gbs"] = max(best_read, read_gbs)
            best_peak = None if peak is None else max(best_peak, peak_gops)
            best_amx = None if amx_peak is None else max(best_amx, amx_gops)
            row["int8_peak_gops"] = best_amx if row["amx"] else best_peak
            results["rows"].append(row)
            label = f"{n_rows}x{cols}" + ("*" if cols != n_cols else "") + ("r" if rows16 else "") \
                + ("h" if row["held_as"] else "")
            share = row["gbs"][max(threads)] / row["read_gbs"] * 100
            row["peak_share"] = None if row["int8_peak_gops"] is None else row["gflops"] / row["int8_peak_gops"]
            peer = ""
            if compare:
                secs = _ggml_seconds(fmt, w_file, x1, max(threads), repeat, nodes=8, warm=True)
                row["ggml_gbs"] = w_file.nbytes / secs / 1e9
                secs = _ggml_seconds(fmt, w_file, xb, batch_threads, 1 if w.nbytes > 2**26 else repeat, nodes=1, warm=False)
                row["ggml_gflops"] = 2.0 * n_rows * cols * batch / secs / 1e9
                peer = f" {row['ggml_gbs']:18.1f} {row['ggml_gflops']:17.1f}"
            out(f"{name:6} {label:>14} {row['gbs_cpu']:11.1f} " + " ".join(f"{row['gbs'][n]:9.1f}" for n in threads)
                + f" {share:8.0f}% {row['gflops']:18.1f} "
                + ("     -" if row["peak_share"] is None else f"{100 * row['peak_share']:5.0f}%")
                + ("a" if row["amx"] else " ") + peer)
    out("* 256-block columns rounded up to whole blocks; r: the weights in the rows-16 layout a loaded model"
        " holds them in; h: held as another type's blocks, as a loaded model holds them ("
        + ", ".join(f"{a.name} as {b.name}" for a, b in q.HELD_AS.items()) + "); 'cpu': on the thread's CPU clock"
        + (" (the batch and the int8 peak too)" if batch_threads == 1 else "")
        + "; %read and %peak: against the highest figures measured up to the row"
        + ("; a: the batch took its integer dots from the AMX tiles, %peak against the AMX peak" if amx_peak else ""))
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gguflm.bench kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--types", default=",".join(TYPES), help="comma-separated formats")
    parser.add_argument("--shapes", default=",".join(f"{r}x{c}" for r, c in SHAPES), help="rows x cols list")
    parser.add_argument("--threads", default="1,2", help="thread counts for the single-token matvec")
    parser.add_argument("--batch", type=int, default=512, help="tokens of the batch matmul")
    parser.add_argument("--batch-threads", type=int, default=2)
    parser.add_argument("--membw-mib", type=int, default=1024, help="read-bandwidth buffer size")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--isa", help=f"force a kernel variant ({', '.join(system.ISAS)})")
    parser.add_argument("--arith", help=f"reproduce another ggml build ({', '.join(system.ARITHMETICS)})")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    parser.add_argument("--compare", choices=["llama-cpp"],
                        help="also time llama.cpp's ggml-cpu (llama-cpp-python's libraries) on the same weights")
    args = parser.parse_args(argv)
    compare = args.compare == "llama-cpp"
    if compare and llama_cpp_or_none("kernels") is None:
        return 2
    if args.isa:
        system.set_isa(args.isa)
    if args.arith:
        system.set_arithmetic(args.arith)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    kwargs = dict(types=args.types.split(","), shapes=shapes, threads=[int(n) for n in args.threads.split(",")],
                  batch=args.batch, batch_threads=args.batch_threads, membw_bytes=args.membw_mib << 20,
                  repeat=args.repeat, compare=compare)
    if args.quick:
        kwargs.update(shapes=[(64, 256)], batch=4, membw_bytes=1 << 20, repeat=1)
    run(**kwargs)
    return 0
