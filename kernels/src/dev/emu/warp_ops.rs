//! Warp-collective matrix operations, computed once all 32 lanes have arrived, with the
//! fragment layouts of the PTX ISA (ldmatrix m8n8.x4; mma m16n8k16 .row.col).

use super::sched::{Event, ThreadCtx, fault};
use std::format;
use std::vec::Vec;

fn half_to_f32(h: u16, bf16: bool) -> f32 {
    if bf16 { f32::from_bits((h as u32) << 16) } else { f16::from_bits(h) as f32 }
}

/// ldmatrix .x4: lane 8m + r supplies row r of matrix m (8 halves at its address). Without
/// .trans lane l receives, for each matrix m, elements (l/4, 2(l%4)) and (l/4, 2(l%4)+1);
/// with .trans, elements (2(l%4), l/4) and (2(l%4)+1, l/4). The first is the low half.
pub(crate) fn ldmatrix(evs: &[Event], lanes: &[ThreadCtx<'_>]) -> Vec<[u32; 4]> {
    let mut m = [[[0u16; 8]; 8]; 4];
    let mut trans = false;
    for (l, ev) in evs.iter().enumerate() {
        let Event::Ldmatrix { addr, trans: t, at } = *ev else { unreachable!() };
        trans = t;
        if addr % 16 != 0 {
            fault(format!("lane {l} gives ldmatrix a row address {addr:#x} not aligned to 16 bytes, at {at}"));
        }
        lanes[l].shared_access(addr, 16, false, at);
        // SAFETY: checked to lie in the block's shared memory just above.
        let row = unsafe { core::ptr::read_unaligned(addr as *const [u16; 8]) };
        m[l / 8][l % 8] = row;
    }
    (0..32)
        .map(|l| {
            let (g, t) = (l / 4, l % 4);
            core::array::from_fn(|j| {
                let (lo, hi) = if trans { (m[j][2 * t][g], m[j][2 * t + 1][g]) } else { (m[j][g][2 * t], m[j][g][2 * t + 1]) };
                lo as u32 | (hi as u32) << 16
            })
        })
        .collect()
}

/// mma.m16n8k16.row.col with f32 accumulation: D = A B + C, lane l = 4g + t holding
/// A rows g, g+8 at columns 2t, 2t+1 (+8), B columns g at rows 2t, 2t+1 (+8), C/D rows g,
/// g+8 at columns 2t, 2t+1.
pub(crate) fn mma(evs: &[Event]) -> Vec<[u32; 4]> {
    let mut a = [[0f32; 16]; 16];
    let mut b = [[0f32; 8]; 16];
    let mut c = [[0f32; 8]; 16];
    for (l, ev) in evs.iter().enumerate() {
        let Event::Mma { a: fa, b: fb, c: fc, bf16, .. } = *ev else { unreachable!() };
        let (g, t) = (l / 4, l % 4);
        let h = |x: u32, i: u32| half_to_f32((x >> (16 * i)) as u16, bf16);
        for (r, k0, reg) in [(g, 0, fa[0]), (g + 8, 0, fa[1]), (g, 8, fa[2]), (g + 8, 8, fa[3])] {
            a[r][k0 + 2 * t] = h(reg, 0);
            a[r][k0 + 2 * t + 1] = h(reg, 1);
        }
        for (k0, reg) in [(0, fb[0]), (8, fb[1])] {
            b[k0 + 2 * t][g] = h(reg, 0);
            b[k0 + 2 * t + 1][g] = h(reg, 1);
        }
        c[g][2 * t] = f32::from_bits(fc[0]);
        c[g][2 * t + 1] = f32::from_bits(fc[1]);
        c[g + 8][2 * t] = f32::from_bits(fc[2]);
        c[g + 8][2 * t + 1] = f32::from_bits(fc[3]);
    }
    let d = |r: usize, n: usize| (0..16).fold(c[r][n], |acc, k| acc + a[r][k] * b[k][n]).to_bits();
    (0..32)
        .map(|l| {
            let (g, t) = (l / 4, l % 4);
            [d(g, 2 * t), d(g, 2 * t + 1), d(g + 8, 2 * t), d(g + 8, 2 * t + 1)]
        })
        .collect()
}
