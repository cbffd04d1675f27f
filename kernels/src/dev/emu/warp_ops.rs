//! Warp-collective matrix operations, computed once all 32 lanes have arrived, with the
//! fragment layouts of the PTX ISA (ldmatrix m8n8.x4; mma m16n8k16 .row.col).

use super::sched::{Event, ThreadCtx, fault};
use std::format;
use std::vec::Vec;

fn half_to_f32(h: u16, bf16: bool) -> f32 {
    if bf16 { f32::from_bits((h as u32) << 16) } else { super::ops::f16_to_f32(h) }
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

/// Byte offset of element (row r, column c) of a 128-byte-swizzle canonical layout: `r` is
/// along the rows of 128 bytes (8-row groups `sbo` apart), `c` inside a 64-element row;
/// blocks of 64 columns are `lbo` apart (MN-major only). The swizzle XORs the 16-byte chunk
/// index (bits 4-6) with the row in its 1024-byte atom (bits 7-9) of the final address.
fn sw128(start: usize, lbo: usize, sbo: usize, r: usize, c: usize) -> usize {
    let a = start + (c / 64) * lbo + (r / 8) * sbo + (r % 8) * 128 + (c % 64) * 2;
    a ^ (((a >> 7) & 7) << 4)
}

/// Decodes a wgmma descriptor: (start, lbo, sbo) in bytes; only the 128-byte swizzle with
/// base offset 0 is emulated.
fn desc_fields(d: u64) -> (usize, usize, usize) {
    if d >> 62 != 1 || (d >> 49) & 7 != 0 {
        super::sched::fault(format!("wgmma descriptor {d:#x}: only the 128-byte swizzle with base offset 0 is emulated"));
    }
    (((d & 0x3fff) << 4) as usize, (((d >> 16) & 0x3fff) << 4) as usize, (((d >> 32) & 0x3fff) << 4) as usize)
}

/// wgmma.mma_async m64nNk16 (N = 8 nt) with f32 accumulation, for one warpgroup. A: by
/// descriptor (K-major: A[m][k] at row m, column k; MN-major when transposed: row k, column
/// m) or from registers (warp w, lane 4g + t: rows 16w + g and + 8 at
/// k = 2t, 2t + 1, and + 8); B by descriptor, K-major (B[k][n] at row n, column k) or
/// MN-major when transposed (row k, column n). D: warp w, lane 4g + t, acc[4j..4j + 4] =
/// rows 16w + g, + 8 at columns 8j + 2t, + 1. Shared memory is read as thread 0 of the
/// warpgroup (for the emulator's initialisation and race checks).
pub(crate) fn wgmma(evs: &[Event], lanes: &[ThreadCtx<'_>], smem_len: usize) {
    let Event::Wgmma { a_desc, b, nt, accumulate, trans_a, trans_b, bf16, at, .. } = evs[0] else { unreachable!() };
    let n = nt as usize * 8;
    let base = lanes[0].shared_base() as usize;
    let read = |off: usize| -> f32 {
        if off + 2 > smem_len {
            super::sched::fault(format!("wgmma reads shared offset {off} outside the block's {smem_len} bytes, at {at}"));
        }
        lanes[0].shared_access(base + off, 2, false, at);
        // SAFETY: inside the block's shared memory, checked just above.
        half_to_f32(unsafe { core::ptr::read_unaligned((base + off) as *const u16) }, bf16)
    };
    let mut a = [[0f32; 16]; 64];
    match a_desc {
        Some(d) => {
            let (start, lbo, sbo) = desc_fields(d);
            for (m, row) in a.iter_mut().enumerate() {
                for (k, x) in row.iter_mut().enumerate() {
                    *x = if trans_a { read(sw128(start, lbo, sbo, k, m)) } else { read(sw128(start, 0, sbo, m, k)) };
                }
            }
        }
        None => {
            for (l, ev) in evs.iter().enumerate() {
                let Event::Wgmma { a_regs, .. } = *ev else { unreachable!() };
                let (w, g, t) = (l / 32, (l % 32) / 4, l % 4);
                let h = |x: u32, i: u32| half_to_f32((x >> (16 * i)) as u16, bf16);
                for (r, k0, reg) in [(g, 0, a_regs[0]), (g + 8, 0, a_regs[1]), (g, 8, a_regs[2]), (g + 8, 8, a_regs[3])] {
                    a[16 * w + r][k0 + 2 * t] = h(reg, 0);
                    a[16 * w + r][k0 + 2 * t + 1] = h(reg, 1);
                }
            }
        }
    }
    let (start, lbo, sbo) = desc_fields(b);
    let bm: Vec<[f32; 16]> = (0..n)
        .map(|col| {
            core::array::from_fn(|k| if trans_b { read(sw128(start, lbo, sbo, k, col)) } else { read(sw128(start, 0, sbo, col, k)) })
        })
        .collect();
    for (l, ev) in evs.iter().enumerate() {
        let Event::Wgmma { acc, .. } = *ev else { unreachable!() };
        let (w, g, t) = (l / 32, (l % 32) / 4, l % 4);
        for j in 0..nt as usize {
            for (e, (r, c)) in [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)].into_iter().enumerate() {
                let (row, col) = (16 * w + r, 8 * j + c);
                // SAFETY: the thread passed a live array of 4 nt accumulators and is suspended.
                let d = unsafe { &mut *acc.add(4 * j + e) };
                let init = if accumulate { *d } else { 0.0 };
                *d = (0..16).fold(init, |s, k| s + a[row][k] * bm[col][k]);
            }
        }
    }
}
