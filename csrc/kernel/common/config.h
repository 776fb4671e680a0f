// Included first by every kernel header: CuTe settings that must precede its headers.
#pragma once

// Enables WGMMA atoms with N = 176, 144, 112, 80, ... (any multiple of 8 up to 256); the
// head-dim tiles in policy.h rely on them.
#ifndef CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#endif
