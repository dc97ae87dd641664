//! What a PXE-booting machine and its neighbours send `bcd site` (a
//! request over plain HTTP, its query), and what the ramdisk reads from
//! the kernel command line bcd site put there.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};

use bc_connlimit::Tracker;
use bcd::evidence::discovery::{self, CmdlineError};
use bcd::site::http::{self, Limits, Respond};
use bcd::site::render;
use bcd::site::service::Response;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The longest request sent: past the 8 KiB head, short of what would make
/// the server linger.
const MAX_REQUEST: usize = 16 * 1024;

/// Answers `/boot.ipxe` from the real query parser, checking what it
/// returns; everything else is not found.
struct Probe;

impl Respond for Probe {
    async fn respond(self: Arc<Self>, path: String, query: String, _: IpAddr) -> Response {
        if path != "/boot.ipxe" {
            return Response::NotFound;
        }
        Response::Script(match render::parse_query(&query) {
            Ok(q) => {
                query_holds(&q);
                format!("#!ipxe\n# {}\n", q.mac)
            }
            Err(e) => render::exit_script(&e.to_string()),
        })
    }
}

/// A parsed query is normalized: a lowercase MAC, a lowercase UUID.
fn query_holds(q: &render::BootQuery) {
    assert_eq!(q.mac.len(), 17);
    assert!(q.mac.bytes().enumerate().all(|(i, b)| if i % 3 == 2 {
        b == b':'
    } else {
        b.is_ascii_hexdigit() && !b.is_ascii_uppercase()
    }));
    if let Some(u) = &q.uuid {
        assert_eq!(u.len(), 36);
        assert!(!u.bytes().any(|b| b.is_ascii_uppercase()));
    }
}

fn runtime() -> Option<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()
    })
    .as_ref()
}

/// Raw bytes on a connection to bcd site's server (hyper and bcd site's
/// routing, [`http::connection`]), then the end of the client's sending.
/// First byte even: the bytes are the request as sent. Odd: the rest is a
/// query, sent as `GET /boot.ipxe?<query>` (and given to the query parser
/// directly too). Whatever comes back is HTTP/1 responses.
pub fn site_request(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let request = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        if let Ok(Ok(q)) = std::str::from_utf8(rest).map(render::parse_query) {
            query_holds(&q);
        }
        [b"GET /boot.ipxe?", rest, b" HTTP/1.1\r\nHost: site\r\n\r\n"].concat()
    };
    let request = &request[..request.len().min(MAX_REQUEST)];
    let Some(rt) = runtime() else {
        return;
    };
    let answer = rt.block_on(async {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let peer = SocketAddr::from(([192, 0, 2, 1], 40000));
        let tracker = Tracker::new(1, 1);
        let Ok(slot) = tracker.admit(peer.ip()) else {
            return Vec::new();
        };
        let conn = tokio::spawn(http::connection(
            server,
            peer,
            Arc::new(Probe),
            slot,
            Limits::new(1, 1),
        ));
        let (mut rd, mut wr) = tokio::io::split(&mut client);
        let send = async {
            let _ = wr.write_all(request).await;
            let _ = wr.shutdown().await;
        };
        let mut answer = Vec::new();
        let recv = rd.read_to_end(&mut answer);
        let _ = tokio::join!(send, recv);
        let _ = conn.await;
        assert_eq!(tracker.held(), 0, "the connection's slot is freed");
        answer
    });
    assert!(
        answer.is_empty() || answer.starts_with(b"HTTP/1.1 ") || answer.starts_with(b"HTTP/1.0 "),
        "not an HTTP/1 answer: {:?}",
        String::from_utf8_lossy(&answer[..answer.len().min(64)])
    );
}

/// A kernel command line as `bcd ramdisk` reads it.
pub fn ramdisk_cmdline(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match discovery::parse_cmdline(text) {
        Ok(d) => {
            assert!(text.contains("bc.token=") && text.contains("bc.assertion="));
            assert!(d.token.id.starts_with("tok_"));
            // Never the secret in what may be logged.
            let shown = format!("{d:?}");
            assert!(!shown.contains(&d.token.expose()));
            let _ = bc_wire::site::parse_signed(&d.assertion);
        }
        // Missing means no word of the line sets it.
        Err(CmdlineError::Missing(key)) => assert!(!text
            .split_ascii_whitespace()
            .any(|w| w.starts_with(&format!("{key}=")))),
        Err(_) => {}
    }
}
