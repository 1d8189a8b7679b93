"""Telling the compiler which way a branch usually goes, for compiled loops.

LLVM turns a short ``if a > b: b = a`` into a maximum instruction, which waits for both of its
operands: in a chain of dependent additions (the serving loop's pipeline recurrence) that adds
the maximum's latency to every link. Marked unlikely, the test stays a branch: the processor
predicts it and goes on along the chain, and pays only when the prediction fails. The values
computed are the same either way.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def unlikely(typingctx, condition):
    """``condition`` itself, with the compiler told it is usually false (``llvm.expect``), so
    that the branch it guards is kept a branch rather than made a select."""
    if not isinstance(condition, types.Boolean):
        return None

    def codegen(context, builder, signature, args):
        bit = ir.IntType(1)
        expect = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(bit, [bit, bit]), "llvm.expect.i1")
        return builder.call(expect, [args[0], bit(0)])

    return types.boolean(types.boolean), codegen
