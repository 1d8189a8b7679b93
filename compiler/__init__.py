"""The mapping compiler: model config -> op graph -> regions -> stages -> tiles -> placement ->
routes and colors -> SRAM/KV plan -> bounds, producing a ``wse_emu.program.format.WaferProgram``."""
