//! Fused CPU kernels with hand-written backward passes (see the module docs of each).
