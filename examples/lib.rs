//! Helpers shared by the examples: input data and the accuracy check against the f64
//! reference.

use flashattn::Dtype;

/// `n` standard normal values in `T` from `seed`.
pub fn random<T: Dtype>(seed: u64, n: usize) -> Vec<T> {
    flashattn::rng::Rng::new(seed).tensor(n)
}

/// Relative L2 error of `got` against `want`, printed with `name`; fails the example above
/// `bar`.
pub fn report<T: Dtype>(name: &str, got: &[T], want: &[f64], bar: f64) -> Result<(), String> {
    let got: Vec<f64> = got.iter().map(|x| x.to_f64()).collect();
    let err = flashattn::reference::rel_l2(&got, want);
    println!("  {name:<4} relative error {err:.2e} (bar {bar:.1e})");
    if err <= bar { Ok(()) } else { Err(format!("{name}: relative error {err:.2e} above {bar:.1e}")) }
}
