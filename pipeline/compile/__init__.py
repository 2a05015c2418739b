"""Compilation's room: Inductor's shared cache (``cache``), the workers that compile ahead of capture
(``ahead``), the compiled artifacts a checkpoint carries (``artifacts``), the programs built ahead of time (``aot``),
Inductor's compile-worker pool a load ends (``pool``) and what compiling cost (``cost``)."""
