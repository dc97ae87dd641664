//! `scripts/bench-helper`'s measuring half: N node-key signatures (ES256 of a
//! 32-byte message), either direct from one TPM context (`direct TCTI`, as
//! a root `bcd node` signs) or through `bcd helper` (`helper SOCKET`, as an
//! unprivileged node signs, each signature verified against the key's
//! public half). Prints `signatures/s` on one line.
//!
//!   helper-sign-bench direct swtpm:host=127.0.0.1,port=P 200
//!   helper-sign-bench helper /run/bcd/helper.sock 200
//!   helper-sign-bench helper-concurrent /run/bcd/helper.sock 200   # 4 callers
use std::time::Instant;

use anyhow::{bail, Context as _};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, target, count] = args.as_slice() else {
        bail!("usage: helper-sign-bench direct TCTI N | helper SOCKET N");
    };
    let count: u32 = count.parse().context("N")?;
    let unique = [0x42u8; 32];
    let msg = [0x17u8; 32];
    let elapsed = match mode.as_str() {
        "direct" => {
            let mut tpm = bcd::tpm::Tpm::open(target)?;
            let key = tpm.node_key(&unique)?;
            tpm.sign_digest(&key, &bc_wire::sha256(&msg))?; // warm, as the helper's cache is
            let t0 = Instant::now();
            for _ in 0..count {
                tpm.sign_digest(&key, &bc_wire::sha256(&msg))?;
            }
            let e = t0.elapsed();
            tpm.flush(key)?;
            e
        }
        "helper" => {
            let client = bc_helper::Client::new(std::path::Path::new(target));
            let key = client.node_key(&unique)?;
            client.sign(&key, &msg)?;
            let t0 = Instant::now();
            for _ in 0..count {
                client.sign(&key, &msg)?;
            }
            t0.elapsed()
        }
        // Several callers at once (TLS handshakes of several connections),
        // each on its own connection: the helper's TPM is the only queue.
        "helper-concurrent" => {
            let socket = std::path::PathBuf::from(target);
            let callers = 4;
            let t0 = Instant::now();
            let threads: Vec<_> = (0..callers)
                .map(|_| {
                    let socket = socket.clone();
                    std::thread::spawn(move || -> anyhow::Result<()> {
                        let client = bc_helper::Client::new(&socket);
                        let key = client.node_key(&unique)?;
                        for _ in 0..count / callers {
                            client.sign(&key, &msg)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for t in threads {
                t.join()
                    .map_err(|_| anyhow::anyhow!("a caller panicked"))??;
            }
            t0.elapsed()
        }
        other => bail!("unknown mode {other:?}: direct or helper"),
    };
    println!("{:.1}", f64::from(count) / elapsed.as_secs_f64());
    Ok(())
}
