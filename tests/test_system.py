"""The machine and the one switch: the build path (Cython -> C -> -fopenmp), what the CPU and the
OS enable (CPUID, XCR0, AMX permission), and gguflm.system's ISA and arithmetic reaching every
kernel: the quants, ops and sampling modules and the recorded forward passes."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _llama
import gguflm
from gguflm import Batch, Context, Model
from gguflm import system
from gguflm._ext import ops, plan, quants, sampling
from gguflm._ext import system as ext
from gguflm.threads import physical_cores, resolve_n_threads, usable_cores

ARCH_DIR = Path(__file__).resolve().parent / "data" / "arch"
MODULES = {"quants": quants, "ops": ops, "plan": plan, "sampling": sampling}
BEST = system.supported_isas()[-1]


def test_prange_sums_and_shares_work():
    x = np.arange(1000, dtype=np.float32) / 7
    total, owners = ext.parallel_sum_squares(x, 2)
    assert total == pytest.approx(float(np.sum(x.astype(np.float64) ** 2)), rel=1e-12)
    assert owners.shape == (1000,)
    if ext.build_info()["openmp"]:
        # static schedule over 1000 items with 2 threads: both threads took a half
        assert set(np.unique(owners)) == {0, 1}
        assert (owners[:500] == 0).all() and (owners[500:] == 1).all()
    else:
        assert (owners == 0).all()


def test_prange_rejects_zero_threads():
    with pytest.raises(ValueError):
        ext.parallel_sum_squares(np.ones(4, dtype=np.float32), 0)


def test_thread_resolution(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert resolve_n_threads(None) == usable_cores()
    assert resolve_n_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert resolve_n_threads(None) == 1
    with pytest.raises(ValueError):
        resolve_n_threads(0)


def test_default_threads_count_hyperthread_siblings_once():
    smt = {0: "0,4", 1: "1,5", 2: "2,6", 3: "3,7", 4: "0,4", 5: "1,5", 6: "2,6", 7: "3,7"}
    assert physical_cores(range(8), smt.get) == 4
    assert physical_cores([0, 4], smt.get) == 1          # an affinity of one core's two threads
    assert physical_cores([0, 1, 5], smt.get) == 2
    ranges = {0: "0-1\n", 1: "0-1\n", 2: "2-3\n", 3: "2-3\n"}
    assert physical_cores(range(4), ranges.get) == 2
    assert physical_cores(range(3), lambda cpu: None) == 3   # no topology: each CPU a core
    assert physical_cores([], smt.get) == 1
    assert 1 <= usable_cores() <= len(os.sched_getaffinity(0))


def test_import_keeps_numpy_blas_to_one_thread():
    """Imported before numpy, gguflm stops a BLAS library from starting threads of its own."""
    probe = ("import os, gguflm, numpy; numpy.ones((64, 64)) @ numpy.ones((64, 64)); "
             "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    blas_threads, n_threads = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                                             text=True, check=True).stdout.split()
    assert blas_threads == "1"
    if sys.platform == "linux":
        assert n_threads == "1"


# -- what the CPU has and the OS enables

# CPUID.1:ECX, CPUID.7:EBX/ECX/EDX, CPUID.(7,1):EAX bits and XCR0 states (Intel SDM vol. 2A, CPUID;
# vol. 1, 13.3)
FMA, OSXSAVE, AVX, F16C = 1 << 12, 1 << 27, 1 << 28, 1 << 29
AVX2, AVX512F, AVX512DQ, AVX512BW, AVX512VL = 1 << 5, 1 << 16, 1 << 17, 1 << 30, 1 << 31
AVX512_VNNI = 1 << 11
AMX_BF16, AVX512_FP16, AMX_TILE, AMX_INT8 = 1 << 22, 1 << 23, 1 << 24, 1 << 25
AVX512_BF16 = 1 << 5
XCR0_SSE, XCR0_AVX, XCR0_AVX512, XCR0_AMX = 0x3, 0x7, 0xE7, 0x60000
INTEL, AMD = "GenuineIntel", "AuthenticAMD"


def words(ecx1=0, ebx7=0, ecx7=0, edx7=0, eax7_1=0, xcr0=0, max_leaf=0xD, vendor=INTEL) -> dict:
    return {"max_leaf": max_leaf, "vendor": vendor, "ecx1": ecx1, "ebx7": ebx7, "ecx7": ecx7, "edx7": edx7,
            "eax7_1": eax7_1, "xcr0": xcr0}


AVX2_CPU = dict(ecx1=OSXSAVE | AVX | FMA | F16C, ebx7=AVX2)
AVX512_CPU = dict(ecx1=AVX2_CPU["ecx1"], ebx7=AVX2 | AVX512F | AVX512DQ | AVX512BW | AVX512VL, ecx7=AVX512_VNNI)
AMX_CPU = dict(AVX512_CPU, edx7=AMX_TILE | AMX_INT8 | AMX_BF16 | AVX512_FP16, eax7_1=AVX512_BF16)  # Sapphire Rapids
ZEN4_CPU = dict(AVX512_CPU, eax7_1=AVX512_BF16, vendor=AMD)
AVX512_STATES = {"avx": True, "avx512": True, "amx": False}
ALL_ISAS = ["scalar", "avx2", "avx512", "avx512bf16"]

DECISIONS = {
    # name: (words, ISAs run, native arithmetic, OS states)
    "avx2 machine": (words(**AVX2_CPU, xcr0=XCR0_AVX), ["scalar", "avx2"], "avx2",
                     {"avx": True, "avx512": False, "amx": False}),
    "amd avx2 machine": (words(**AVX2_CPU, xcr0=XCR0_AVX, vendor=AMD), ["scalar", "avx2"], "avx2",
                         {"avx": True, "avx512": False, "amx": False}),
    "avx512 vnni machine": (words(**AVX512_CPU, xcr0=XCR0_AVX512), ["scalar", "avx2", "avx512"], "avx512",
                            AVX512_STATES),
    # GCC tunes for Intel's AVX-512 cores with 256-bit auto-vectorization, for AMD's with 512-bit
    "cooper lake": (words(**dict(AVX512_CPU, eax7_1=AVX512_BF16), xcr0=XCR0_AVX512), ALL_ISAS, "avx512bf16",
                    AVX512_STATES),
    "zen 4": (words(**ZEN4_CPU, xcr0=XCR0_AVX512), ALL_ISAS, "zen4", AVX512_STATES),
    "zen 4, os without avx-512 state": (words(**ZEN4_CPU, xcr0=XCR0_AVX), ["scalar", "avx2"], "avx2",
                                        {"avx": True, "avx512": False, "amx": False}),
    # neither Intel nor AMD: GCC's tuning for an AVX-512 CPU it does not know as AMD's
    "other vendor with avx512_bf16": (words(**dict(ZEN4_CPU, vendor="HygonGenuine"), xcr0=XCR0_AVX512), ALL_ISAS,
                                      "avx512bf16", AVX512_STATES),
    # a hypervisor that advertises AVX-512 but leaves its registers off: what llama.cpp's native
    # build sees too (GCC's -march=native reads XCR0), so the AVX2 build's arithmetic
    "avx512 cpu, os without its state": (words(**AVX512_CPU, xcr0=XCR0_AVX), ["scalar", "avx2"], "avx2",
                                         {"avx": True, "avx512": False, "amx": False}),
    "avx512 cpu, os without avx state": (words(**AVX512_CPU, xcr0=XCR0_SSE), ["scalar"], "avx2",
                                         {"avx": False, "avx512": False, "amx": False}),
    # without OSXSAVE the XCR0 word means nothing (XGETBV would fault)
    "no osxsave": (words(**dict(AVX512_CPU, ecx1=AVX | FMA | F16C), xcr0=XCR0_AVX512), ["scalar"], "avx2",
                   {"avx": False, "avx512": False, "amx": False}),
    "leaf 7 beyond max_leaf": (words(**AVX512_CPU, xcr0=XCR0_AVX512, max_leaf=6), ["scalar"], "avx2",
                               AVX512_STATES),
    "avx2 without f16c": (words(**dict(AVX2_CPU, ecx1=OSXSAVE | AVX | FMA), xcr0=XCR0_AVX), ["scalar"], "avx2",
                          {"avx": True, "avx512": False, "amx": False}),
    "avx512 without vnni": (words(**dict(AVX512_CPU, ecx7=0), xcr0=XCR0_AVX512), ["scalar", "avx2"], "avx512",
                            AVX512_STATES),
    "amx cpu, os without tile state": (words(**AMX_CPU, xcr0=XCR0_AVX512), ALL_ISAS, "avx512bf16", AVX512_STATES),
    "amx cpu, only XTILECFG": (words(**AMX_CPU, xcr0=XCR0_AVX512 | 0x20000), ALL_ISAS, "avx512bf16", AVX512_STATES),
    # AVX512_FP16 leaves ggml's float dots in fp32 (only flash attention's F16 sums change)
    "amx machine": (words(**AMX_CPU, xcr0=XCR0_AVX512 | XCR0_AMX), ALL_ISAS, "avx512bf16",
                    {"avx": True, "avx512": True, "amx": True}),
}


@pytest.mark.parametrize("name", DECISIONS)
def test_decision_table(name):
    given_words, isas, arithmetic, os_states = DECISIONS[name]
    decided = ext.decide_features(given_words)
    assert decided["isas"] == isas
    assert decided["native_arithmetic"] == arithmetic
    assert decided["os"] == os_states
    usable, cpu = decided["usable"], decided["cpu"]
    for feature in usable:
        state = "amx" if feature.startswith("amx") else "avx512" if feature.startswith("avx512") else "avx"
        assert usable[feature] == (cpu[feature] and os_states[state]), feature


ARITH_NEEDS = {"avx2": set(), "avx512": {"avx512f"}, "avx512bf16": {"avx512f", "avx512_bf16"},
               "zen4": {"avx512f", "avx512_bf16"}}


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 0x20), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
       st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
       st.sampled_from([INTEL, AMD, "HygonGenuine"]))
def test_decision_properties(max_leaf, ecx1, ebx7, ecx7, edx7, eax7_1, xcr0, mask, vendor):
    given_words = words(ecx1, ebx7, ecx7, edx7, eax7_1, xcr0, max_leaf, vendor)
    decided = ext.decide_features(given_words)
    usable, cpu = decided["usable"], decided["cpu"]
    assert all(cpu[f] for f in usable if usable[f])
    assert decided["isas"] == list(system.ISAS[:len(decided["isas"])]) and decided["isas"][0] == "scalar"
    if not (ecx1 & OSXSAVE and max_leaf >= 1):
        assert not any(decided["os"].values()) and decided["isas"] == ["scalar"]
    # the native build uses every instruction set the machine runs, and no other
    native = decided["native_arithmetic"]
    runnable = [a for a in system.ARITHMETICS if all(usable[f] for f in ARITH_NEEDS[a])]
    assert native in runnable and len(ARITH_NEEDS[native]) == max(len(ARITH_NEEDS[a]) for a in runnable)
    assert (native == "zen4") == (vendor == AMD and usable["avx512f"] and usable["avx512_bf16"])
    # the OS taking a register state away never makes a feature usable
    fewer = ext.decide_features(dict(given_words, xcr0=xcr0 & mask))
    assert all(usable[f] for f in fewer["usable"] if fewer["usable"][f])


def test_this_machine_agrees_with_the_kernel():
    """Linux lists in /proc/cpuinfo the features the CPU has and XCR0 enables: exactly what is usable
    (our feature names are the kernel's flag names), of those GGUFLM_CPU's profile keeps."""
    features = ext.cpu_features()
    assert features == ext.decide_features(ext.cpu_words())
    with open("/proc/cpuinfo") as f:
        flags = set(next(line for line in f if line.startswith("flags")).split(":")[1].split())
    kept = set(ext.CPU_PROFILES[ext.cpu_profile()] if ext.cpu_profile() else ext.FEATURES)
    assert features["usable"] == {name: name in flags and name in kept for name in features["usable"]}
    assert features["isas"] == system.supported_isas()


def test_system_info_reports_what_runs():
    info = gguflm.system_info()
    assert info["compiler"] and isinstance(info["openmp"], bool) and info["usable_cores"] >= 1
    assert info["isa"] == system.current_isa() and info["arithmetic"] == system.current_arithmetic()
    assert info["supported_isas"] == system.supported_isas() and info["isa"] in info["supported_isas"]
    assert info["native_arithmetic"] == ext.decide_features(ext.read_cpu_words())["native_arithmetic"] in \
        system.ARITHMETICS
    assert info["cpu_vendor"] == ext.cpu_features()["vendor"] in ("intel", "amd", "other")
    feats = info["cpu_features"]
    assert set(feats) == set(info["cpu_advertises"]) >= {"avx2", "fma", "f16c", "avx512f", "avx512_vnni", "amx_tile",
                                                         "avx512_bf16", "avx512_fp16"}
    assert all(info["cpu_advertises"][f] for f in feats if feats[f])
    assert set(info["os_enables"]) == {"avx", "avx512", "amx"}
    assert info["amx"]["cpu"] == (info["cpu_advertises"]["amx_tile"] and info["cpu_advertises"]["amx_int8"])
    assert info["amx"]["os"] == info["os_enables"]["amx"]
    with system.using(isa="scalar", arithmetic="avx2"):
        assert (gguflm.system_info()["isa"], gguflm.system_info()["arithmetic"]) == ("scalar", "avx2")


def test_amx_permission_is_asked_only_where_amx_exists():
    """In child processes (a grant enlarges their signal frames): with GGUFLM_AMX=0 nothing is asked
    at import; asked then, Linux grants the tile data state where the CPU and the OS have AMX, and
    elsewhere nothing is asked. By default the import asks, and the tiles are on where granted."""
    def child(code: str, **env: str) -> list:
        environ = {k: v for k, v in os.environ.items() if k != "GGUFLM_AMX"} | env
        return json.loads(subprocess.run([sys.executable, "-c", "from gguflm._ext import system as s; import json; "
                                          f"print(json.dumps({code}))"], capture_output=True, text=True, check=True,
                                         env=environ).stdout)
    before, on, granted, after = child("[s.amx_support(), s.amx(), s.request_amx(), s.amx_support()]", GGUFLM_AMX="0")
    assert not before["permitted"] and not on
    has = bool(before["cpu"] and before["os"] and sys.platform == "linux")
    assert granted == after["permitted"] == has
    assert child("[s.amx_support()['permitted'], s.amx()]") == [has, has]


# -- one switch for every kernel

def test_one_switch_reaches_every_module():
    for isa in system.supported_isas():
        for arithmetic in system.ARITHMETICS:
            with system.using(isa=isa, arithmetic=arithmetic):
                for name, module in MODULES.items():
                    assert module.dispatch() == {"isa": isa, "arithmetic": arithmetic}, name
    for module in [*MODULES.values(), gguflm.quants]:
        assert not {"set_isa", "current_isa", "set_arithmetic", "current_arithmetic"} & set(dir(module))


def test_setters_refuse_what_this_machine_cannot_run():
    before = (system.current_isa(), system.current_arithmetic())
    with pytest.raises(ValueError, match="unknown ISA 'sse9'"):
        system.set_isa("sse9")
    with pytest.raises(ValueError, match="unknown arithmetic 'sse'"):
        system.set_arithmetic("sse")
    for isa in set(system.ISAS) - set(system.supported_isas()):
        with pytest.raises(ValueError, match=f"cannot run the {isa} kernels"):
            system.set_isa(isa)
    assert (system.current_isa(), system.current_arithmetic()) == before


@pytest.fixture
def simulated():
    """Checks ISAs as on another machine; this one, and its ISA, restored afterwards."""
    before = system.current_isa()
    yield ext._simulate_machine
    ext._simulate_machine(None)
    system.set_isa(before)


@pytest.mark.parametrize("machine,isa,reason", [
    ("avx2 machine", "avx512", "avx512f (not in this CPU)"),
    ("avx512 cpu, os without its state", "avx512", "avx512f (the OS does not enable it)"),
    ("avx512 without vnni", "avx512", "avx512_vnni (not in this CPU)"),
    ("avx512 vnni machine", "avx512bf16", "avx512_bf16 (not in this CPU)"),
    ("zen 4, os without avx-512 state", "avx512bf16", "avx512_bf16 (the OS does not enable it)"),
])
def test_set_isa_names_what_is_missing(simulated, machine, isa, reason):
    simulated(DECISIONS[machine][0])
    assert system.supported_isas() == DECISIONS[machine][1]
    before = system.current_isa()
    with pytest.raises(ValueError, match=rf"cannot run the {isa} kernels: .*{re.escape(reason)}"):
        system.set_isa(isa)
    assert system.current_isa() == before
    assert system.set_isa("scalar") == before


_NAMED = r"(\w+) \((?:not in this CPU|the OS does not enable it)\)"


@pytest.mark.parametrize("machine", DECISIONS)
def test_every_switch_names_what_a_machine_lacks(machine):
    """On each simulated machine (its CPUID and XCR0 words: AVX2-only, AVX-512 without VNNI, VBMI
    or BF16, with AMX, with the OS holding states back...), each setter refuses exactly what the
    machine lacks, naming every missing feature and no other; what it has is accepted."""
    before = (system.current_isa(), system.vbmi(), system.amx())
    decided = ext.decide_features(DECISIONS[machine][0])
    usable = decided["usable"]
    try:
        ext._simulate_machine(DECISIONS[machine][0])
        vbmi_needs = ext.ISA_NEEDS["avx512"] + ("avx512vbmi", "gfni", "avx512_bitalg")
        for name, needs, setter, value in [*((isa, ext.ISA_NEEDS[isa], system.set_isa, isa) for isa in system.ISAS),
                                           ("vbmi", vbmi_needs, system.set_vbmi, True),
                                           ("amx", ("amx_tile", "amx_int8"), system.set_amx, True)]:
            missing = [f for f in needs if not usable[f]]
            try:
                setter(value)
                assert not missing, (name, missing)
            except ValueError as e:
                if name == "amx" and not missing:   # the machine has AMX: the kernel's grant decides
                    assert "did not grant" in str(e)
                else:
                    assert re.findall(_NAMED, str(e)) == missing, str(e)
            finally:   # back to what this machine runs before anything computes
                ext._simulate_machine(None)
                system.set_isa(before[0]), system.set_vbmi(before[1]), system.set_amx(before[2])
                ext._simulate_machine(DECISIONS[machine][0])
        assert decided["vbmi"] == all(usable[f] for f in vbmi_needs)
    finally:
        ext._simulate_machine(None)
        system.set_isa(before[0]), system.set_vbmi(before[1]), system.set_amx(before[2])


def full_batch(tokens) -> Batch:
    b = Batch(len(tokens))
    for i, t in enumerate(tokens):
        b.add(int(t), i, [0], True)
    return b


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"])
def test_forward_passes_run_the_isa_in_force_with_the_same_bits(arch):
    tokens = np.load(ARCH_DIR / f"{arch}.npz")["tokens"]
    logits = {}
    with Model.load(ARCH_DIR / f"{arch}.gguf") as model:
        for isa in system.supported_isas():
            with system.using(isa=isa), Context(model, n_ctx=128) as ctx:
                assert ctx.decode(full_batch(tokens)) == 0
                logits[isa] = ctx.get_logits().copy()
                (recorded,) = ctx._plans.values()
                assert recorded.last_run == {"isa": isa, "arithmetic": system.current_arithmetic()}
    for isa, values in logits.items():
        assert np.array_equal(values.view(np.uint32), logits["scalar"].view(np.uint32)), isa


def test_a_context_follows_the_switch_with_the_plans_it_recorded():
    """Plans read the switch when a pass starts: an ISA changes nothing but the kernels, an
    arithmetic changes the rounding (on Gemma 3's tiny model; the others' logits happen to round
    alike in both), and no plan is recorded again."""
    tokens = np.load(ARCH_DIR / "gemma3.npz")["tokens"]
    with Model.load(ARCH_DIR / "gemma3.gguf") as model, Context(model, n_ctx=128) as ctx:
        def run(isa: str, arithmetic: str) -> np.ndarray:
            ctx.memory.seq_rm(-1)
            with system.using(isa=isa, arithmetic=arithmetic):
                assert ctx.decode(full_batch(tokens)) == 0
            (recorded,) = ctx._plans.values()
            assert recorded.last_run == {"isa": isa, "arithmetic": arithmetic}
            return ctx.get_logits().copy()

        first = run(BEST, "avx2")
        recorded = list(ctx._plans.values())
        assert np.array_equal(run("scalar", "avx2"), first)
        assert not np.array_equal(run("scalar", "avx512"), first)
        assert list(ctx._plans.values()) == recorded


def _in_child(env: dict, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)


def test_environment_takes_effect_everywhere():
    isa = "avx2" if "avx2" in system.supported_isas() else "scalar"
    code = f"""
import json
import numpy as np
from gguflm import Batch, Context, Model, system
from gguflm._ext import ops, plan, quants, sampling
with Model.load({str(ARCH_DIR / "llama.gguf")!r}) as model, Context(model, n_ctx=64) as ctx:
    ctx.decode(Batch.get_one([1, 5, 9]))
    (ran,) = [p.last_run for p in ctx._plans.values()]
print(json.dumps([system.current_isa(), system.current_arithmetic(), ran] + [m.dispatch() for m in (quants, ops, plan, sampling)]))
"""
    done = _in_child({"GGUFLM_ISA": isa, "GGUFLM_ARITH": "avx2"}, code)
    assert done.returncode == 0, done.stderr
    current_isa, current_arith, *reports = json.loads(done.stdout)
    assert (current_isa, current_arith) == (isa, "avx2")
    assert all(report == {"isa": isa, "arithmetic": "avx2"} for report in reports)


def _lacking(needs) -> str:
    """The features of ``needs`` this machine cannot use, each with why, as the setters name them."""
    features = ext.cpu_features()
    return ", ".join(f"{f} ({'the OS does not enable it' if features['cpu'][f] else 'not in this CPU'})"
                     for f in ext.FEATURES if f in needs and not features["usable"][f])


@pytest.mark.parametrize("variable,value,message", [
    ("GGUFLM_ISA", "bogus", "unknown ISA 'bogus'"),
    ("GGUFLM_ARITH", "sse", "unknown arithmetic 'sse'"),
    ("GGUFLM_CPU", "z80", "unknown machine profile 'z80'"),
    *[("GGUFLM_ISA", isa, f"this machine cannot run the {isa} kernels: {_lacking(ext.ISA_NEEDS[isa])}; it runs "
       f"{', '.join(system.supported_isas())}") for isa in sorted(set(system.ISAS) - set(system.supported_isas()))],
])
def test_environment_errors_name_the_variable(variable, value, message):
    done = _in_child({variable: value}, "import gguflm")
    assert done.returncode != 0
    assert f"{variable}={value!r}: {message}" in done.stderr


@pytest.mark.parametrize("profile", ext.CPU_PROFILES)
def test_a_machine_profile_is_what_every_report_says(profile):
    """GGUFLM_CPU makes this machine look like one with fewer features (an AVX2-only one, AVX-512
    without VBMI/GFNI, with them, with AVX512_BF16, with AMX), for a whole run: what the reports say,
    what runs by default, and the errors of what the profile lacks, naming each lacking feature."""
    code = """
import json, gguflm
from gguflm import system
errors = {}
for name, setter in [*((isa, system.set_isa) for isa in system.ISAS), ("vbmi", system.set_vbmi), ("amx", system.set_amx)]:
    try:
        setter(name if setter is system.set_isa else True)
    except ValueError as e:
        errors[name] = str(e)
print(json.dumps([gguflm.system_info(), errors]))
"""
    done = _in_child({"GGUFLM_CPU": profile, "GGUFLM_ISA": "", "GGUFLM_VBMI": "", "GGUFLM_AMX": ""}, code)
    assert done.returncode == 0, done.stderr
    info, errors = json.loads(done.stdout)
    kept, here = set(ext.CPU_PROFILES[profile]), ext.decide_features(ext.read_cpu_words())
    usable = info["cpu_features"]
    assert info["cpu_profile"] == profile
    assert usable == {f: here["usable"][f] and f in kept for f in ext.FEATURES}
    assert info["os_enables"]["avx512"] == (here["os"]["avx512"] and any(usable[f] for f in ext.FEATURES
                                                                           if f.startswith("avx512")))
    runs = [isa for isa in system.ISAS if all(usable[f] for f in ext.ISA_NEEDS[isa])]
    assert info["supported_isas"] == runs
    # the arithmetic stays that of a llama.cpp built natively here
    assert info["native_arithmetic"] == info["arithmetic"] == here["native_arithmetic"]
    vbmi_set = ("avx512vbmi", "gfni", "avx512_bitalg")
    assert info["vbmi"] == ("avx512" in runs and all(usable[f] for f in vbmi_set))
    lacking = {name: [f for f in needs if not usable[f]] for name, needs in
               [*ext.ISA_NEEDS.items(), ("vbmi", ext.ISA_NEEDS["avx512"] + vbmi_set), ("amx", ("amx_tile", "amx_int8"))]}
    for name, missing in lacking.items():
        if missing:   # every lacking feature named, and none that is there
            named = re.findall(r"(\w+) \((?:not in this CPU|the OS does not enable it)\)", errors[name])
            assert named == missing, errors[name]
        elif name != "amx":   # (AMX also needs the kernel's grant)
            assert name not in errors, errors[name]


# -- llama.cpp as the peer, on machines where its build cannot compute

def test_a_peer_that_dies_is_skipped_with_the_signal_named(monkeypatch):
    monkeypatch.setattr(_llama, "L", object())  # installed, as far as the probe knows
    monkeypatch.setattr(_llama, "_PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    monkeypatch.setattr(_llama, "PEER_REQUIRED", False)
    _llama.peer_problem.cache_clear()
    try:
        assert "dies with SIGILL on a 512-token prompt" in _llama.peer_problem()
        with pytest.raises(pytest.skip.Exception, match="SIGILL"):
            _llama.require_peer()
        monkeypatch.setattr(_llama, "PEER_REQUIRED", True)   # CI (GGUFLM_REQUIRE_PEER=1): no skip
        with pytest.raises(pytest.fail.Exception, match="GGUFLM_REQUIRE_PEER=1, but .*SIGILL"):
            _llama.require_peer()
        with pytest.raises(pytest.fail.Exception, match="llama-cpp-python is not installed"):
            _llama.import_peer("llama_cpp_is_not_here")
        monkeypatch.setattr(_llama, "PEER_REQUIRED", False)
        with pytest.raises(pytest.skip.Exception, match="llama-cpp-python is not installed"):
            _llama.import_peer("llama_cpp_is_not_here")
        monkeypatch.setattr(_llama, "_PROBE", "raise SystemExit('no model')")
        _llama.peer_problem.cache_clear()
        assert "fails a 512-token prompt" in _llama.peer_problem() and "no model" in _llama.peer_problem()
    finally:
        _llama.peer_problem.cache_clear()
