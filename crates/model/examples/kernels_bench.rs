// temporary exploration
use gemm::{gemm, Parallelism};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let (n, c, v) = (700usize, 200usize, 33278usize);
    let h: Vec<f32> = (0..n * c)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let w: Vec<f32> = (0..v * c)
        .map(|i| ((i * 104729) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let mut logits = vec![0f32; n * v];
    let mut dw = vec![0f32; v * c];
    let mut dh = vec![0f32; n * c];
    let flop = 2.0 * n as f64 * c as f64 * v as f64;
    for &par in &[Parallelism::None, Parallelism::Rayon(2)] {
        for &vb in &[256usize, 512, 1024, 2048, 4096, v] {
            let nb = (v + vb - 1) / vb;
            let mut ta = vec![];
            let mut tb = vec![];
            let mut tc = vec![];
            for _ in 0..5 {
                // A: logits blocks
                let t = Instant::now();
                for j in 0..nb {
                    let v0 = j * vb;
                    let len = vb.min(v - v0);
                    let dst = logits[n * v0..].as_mut_ptr();
                    unsafe {
                        gemm(
                            n,
                            len,
                            c,
                            dst,
                            1,
                            len as isize,
                            false,
                            h.as_ptr(),
                            1,
                            c as isize,
                            w[v0 * c..].as_ptr(),
                            c as isize,
                            1,
                            0.0,
                            1.0,
                            false,
                            false,
                            false,
                            par,
                        );
                    }
                }
                ta.push(t.elapsed().as_secs_f64());
                let t = Instant::now();
                for j in 0..nb {
                    let v0 = j * vb;
                    let len = vb.min(v - v0);
                    let p = logits[n * v0..].as_ptr();
                    unsafe {
                        gemm(
                            len,
                            c,
                            n,
                            dw[v0 * c..].as_mut_ptr(),
                            1,
                            c as isize,
                            false,
                            p,
                            len as isize,
                            1,
                            h.as_ptr(),
                            1,
                            c as isize,
                            0.0,
                            1.0,
                            false,
                            false,
                            false,
                            par,
                        );
                    }
                }
                tb.push(t.elapsed().as_secs_f64());
                let t = Instant::now();
                for j in 0..nb {
                    let v0 = j * vb;
                    let len = vb.min(v - v0);
                    let p = logits[n * v0..].as_ptr();
                    unsafe {
                        gemm(
                            n,
                            c,
                            len,
                            dh.as_mut_ptr(),
                            1,
                            c as isize,
                            j > 0,
                            p,
                            1,
                            len as isize,
                            w[v0 * c..].as_ptr(),
                            1,
                            c as isize,
                            1.0,
                            1.0,
                            false,
                            false,
                            false,
                            par,
                        );
                    }
                }
                tc.push(t.elapsed().as_secs_f64());
            }
            let (a, b, cc) = (median(ta), median(tb), median(tc));
            println!("{:?} vb={vb:6} A {:7.1} ms {:6.1} GF/s | B {:7.1} ms {:6.1} | C {:7.1} ms {:6.1} | total {:7.1}", par, a*1e3, flop/a/1e9, b*1e3, flop/b/1e9, cc*1e3, flop/cc/1e9, (a+b+cc)*1e3);
        }
    }
    // two std threads, each half the vocab, Parallelism::None
    for &vb in &[512usize, 1024, 2048] {
        let mut tt = vec![];
        for _ in 0..5 {
            let t = Instant::now();
            let half = (v / 2 + vb - 1) / vb * vb;
            let lptr = logits.as_mut_ptr() as usize;
            let dwp = dw.as_mut_ptr() as usize;
            let mut dh2 = vec![0f32; n * c];
            std::thread::scope(|s| {
                let hh = &h;
                let ww = &w;
                let work = move |lo: usize, hi: usize, dhp: usize| {
                    let mut v0 = lo;
                    let mut first = true;
                    while v0 < hi {
                        let len = vb.min(hi - v0);
                        unsafe {
                            let dst = (lptr as *mut f32).add(n * v0);
                            gemm(
                                n,
                                len,
                                c,
                                dst,
                                1,
                                len as isize,
                                false,
                                hh.as_ptr(),
                                1,
                                c as isize,
                                ww[v0 * c..].as_ptr(),
                                c as isize,
                                1,
                                0.0,
                                1.0,
                                false,
                                false,
                                false,
                                Parallelism::None,
                            );
                            gemm(
                                len,
                                c,
                                n,
                                (dwp as *mut f32).add(v0 * c),
                                1,
                                c as isize,
                                false,
                                dst,
                                len as isize,
                                1,
                                hh.as_ptr(),
                                1,
                                c as isize,
                                0.0,
                                1.0,
                                false,
                                false,
                                false,
                                Parallelism::None,
                            );
                            gemm(
                                n,
                                c,
                                len,
                                dhp as *mut f32,
                                1,
                                c as isize,
                                !first,
                                dst,
                                1,
                                len as isize,
                                ww[v0 * c..].as_ptr(),
                                1,
                                c as isize,
                                1.0,
                                1.0,
                                false,
                                false,
                                false,
                                Parallelism::None,
                            );
                        }
                        first = false;
                        v0 += len;
                    }
                };
                let d1 = dh2.as_mut_ptr() as usize;
                let jh = s.spawn(move || work(half, v, d1));
                work(0, half, dh.as_mut_ptr() as usize);
                jh.join().unwrap();
            });
            tt.push(t.elapsed().as_secs_f64());
        }
        let m = median(tt);
        println!(
            "2 threads fused vb={vb}: {:.1} ms, {:.1} GF/s (3 matmuls)",
            m * 1e3,
            3.0 * flop / m / 1e9
        );
    }
}
