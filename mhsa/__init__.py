"""The tools layer: commands, reports, renderers and plots built on top of the implementations.

They reach numpy_ref, torch_impl and jax_impl only through `mhsa.registry`; nothing
in the contract layer (`shared/*.py`) or in an implementation imports from here.
"""
