"""Compilation's room: Inductor's shared cache (``cache``), the workers that compile ahead of capture
(``ahead``), the compiled artifacts a checkpoint carries (``artifacts``) and what compiling cost (``cost``)."""
