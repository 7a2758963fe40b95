"""Crash analysis: the sandboxed unwinder, its result, module and identity facts, the signature."""
