// Emulator stand-in: nothing to patch for a host compiler.
#pragma once
