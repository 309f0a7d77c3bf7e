"""Import of the private extension, in one place.

An installed lowbit has ``lowbit/_lowbit.*.so``. A development build made with plain CMake
(``cmake -B build && cmake --build build``) leaves ``_lowbit`` in the build directory:
put that directory on PYTHONPATH and it is found as a top-level module.
"""
try:
    from . import _lowbit as lib  # noqa: F401
except ImportError:  # pragma: no cover - development builds only
    import _lowbit as lib  # noqa: F401
