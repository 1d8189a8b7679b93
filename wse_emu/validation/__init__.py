"""Every published measurement the emulator is compared against, in one place (``wse-emu
validate``): each check's reference (source, date, what was measured), the emulator's figure
from the current code, their ratio and the band it is held to. The fast checks gate the test
suite; the slow ones run in the slow tier; docs/accuracy.md is generated from all of them."""
