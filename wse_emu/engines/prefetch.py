"""Asking the processor to bring an array entry into its caches ahead of its use.

A whole-wafer stage's arrays are a hundred megabytes, and the engines read them in the order
events come, which no cache predicts: each read of a line not cached waits for memory. The
events of one cycle are known when the cycle opens (``calendar``), so their first reads can be
asked for then, and the lines arrive while the events before them are handled.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def prefetch(typingctx, array, index):
    """Start bringing ``array[index]`` (of a C-contiguous 1-D array) into the caches for
    reading. Nothing else happens: no value is read, and an index past the array's end faults
    nothing (the processor drops such a request), so a caller may ask for the entry after a
    range's last without checking that there is one."""
    if not (isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C"
            and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        where = builder.gep(data, [context.cast(builder, args[1], signature.args[1],
                                                types.intp)])
        # The intrinsic takes a byte pointer, whatever the array holds (LLVM names it for
        # the pointer type it is declared with).
        where = builder.bitcast(where, ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [where.type, i32, i32, i32]),
            "llvm.prefetch.p0i8")
        # read, keep in every cache level, a data (not instruction) line
        builder.call(fn, [where, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(array, index), codegen
