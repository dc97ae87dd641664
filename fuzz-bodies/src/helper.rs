//! The root helper's frames (bc-helper): what a caller sends the root side
//! (length-prefixed requests, checked into an [`Operation`]) and what the
//! node's client reads back from whatever listens on the socket (a frame,
//! its response, the checks of an AK or a node key), through the real
//! `Client` over a real unix socket.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixListener;
use std::sync::{mpsc, Mutex, OnceLock};

use bc_helper::proto::{self, Request};
use bc_helper::{Client, Operation};
use prost::Message;

/// The first byte picks: 0, the rest as the byte stream a caller sends
/// the helper (frames, one after the other); 1 and 2, the rest as what
/// the helper answers the client's `tpm.ak` or `tpm.nodekey`.
pub fn helper_frames(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => requests(rest),
        _ => answers(which % 3 == 1, rest),
    }
}

/// Each whole frame the helper would read from `stream`, checked; a
/// checked operation asks again for exactly itself.
fn requests(mut stream: &[u8]) {
    while let Some((prefix, rest)) = stream.split_first_chunk::<4>() {
        let Ok(len) = proto::body_len(*prefix, proto::MAX_REQUEST) else {
            return;
        };
        assert!(len <= proto::MAX_REQUEST);
        let Some((body, rest)) = (rest.len() >= len).then(|| rest.split_at(len)) else {
            return;
        };
        stream = rest;
        let Ok(request) = Request::decode(body) else {
            continue;
        };
        let Ok(op) = Operation::from_request(request) else {
            continue;
        };
        let again = op.to_request();
        assert_eq!(Operation::from_request(again.clone()).as_ref(), Ok(&op));
        let frame = proto::frame(&again);
        assert!(
            frame.len() <= 4 + proto::MAX_REQUEST,
            "{op:?}: {} bytes",
            frame.len()
        );
        assert_eq!(
            proto::body_len(
                frame[..4].try_into().unwrap_or_default(),
                proto::MAX_REQUEST
            ),
            Ok(frame.len() - 4)
        );
    }
}

/// A socket whose listener answers each connection with the bytes it is
/// handed, after reading the request, then closes.
struct Stub {
    path: std::path::PathBuf,
    answers: mpsc::Sender<Vec<u8>>,
    _dir: tempfile::TempDir,
}

fn stub() -> Option<&'static Mutex<Stub>> {
    static STUB: OnceLock<Option<Mutex<Stub>>> = OnceLock::new();
    STUB.get_or_init(|| {
        // SAFETY: ignoring a signal installs no handler code; a peer that
        // left is then an EPIPE, as in every Rust binary libFuzzer is not.
        let _ = unsafe {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGPIPE,
                nix::sys::signal::SigHandler::SigIgn,
            )
        };
        let dir = crate::fixtures::scratch_dir().ok()?;
        let path = dir.path().join("helper.sock");
        let listener = UnixListener::bind(&path).ok()?;
        let (answers, next) = mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            for answer in next {
                let Ok((mut s, _)) = listener.accept() else {
                    return;
                };
                let mut buf = [0u8; 4 + proto::MAX_REQUEST];
                let _ = s.read(&mut buf);
                let _ = s.write_all(&answer);
            }
        });
        Some(Mutex::new(Stub {
            path,
            answers,
            _dir: dir,
        }))
    })
    .as_ref()
}

/// The client's `tpm.ak` (`ak`) or `tpm.nodekey` against `answer`: an Ok
/// is a checked AK or node key.
fn answers(ak: bool, answer: &[u8]) {
    let Some(stub) = stub() else {
        return;
    };
    let stub = stub.lock().unwrap_or_else(|p| p.into_inner());
    if stub.answers.send(answer.to_vec()).is_err() {
        return;
    }
    let client = Client::new(&stub.path);
    if ak {
        if let Ok(ak) = client.ak() {
            let parsed = bc_wire::tpm::Public::parse(&ak.public);
            assert!(parsed.is_ok_and(|p| p.name() == ak.name));
        }
    } else if let Ok(key) = client.node_key(&[7; 32]) {
        let _ = key;
    }
}
