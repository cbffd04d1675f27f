//! Bench support; the benches live in `benches/` and the side-by-side comparison with
//! PyTorch in `side_by_side.py` (run on the GPU machine, see the README).
