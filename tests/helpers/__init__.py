"""Helpers shared by the test files (tests/ is on sys.path: ``from helpers.gpu import ...``).

* ``gpu.py``            why a GPU file skips (``gpu_marks``), the poisoned caching allocator
* ``emu.py``            build and drive the CPU emulation of the HIP kernels (tests/emu/)
* ``flash_emulator.py`` a CPU stand-in for aten's varlen flash attention ops
* ``cp.py``             context-parallel problem helpers (cu_seqlens, poisoned inputs, the
                        comparison against the reference, a group stand-in)
* ``cp_spawn.py``       spawned process-group worlds for the CP suites
* ``small_seq_tiled_gpu.py`` the tiled small-seq GPU files' device, dtype / head grids,
                        random segment lengths

Fixtures live in tests/conftest.py.
"""
