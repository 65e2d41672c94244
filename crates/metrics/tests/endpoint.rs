//! The endpoint over real loopback TCP: what it answers, and that bad
//! requests get a 4xx and leave it serving.

use nasd_metrics::prometheus_client::metrics::counter::Counter;
use nasd_metrics::{scrape, serve, sum_of, Metrics, REQUEST_HEAD_MAX};
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn start() -> (SocketAddr, Counter, tokio::sync::oneshot::Sender<()>) {
    let metrics = Metrics::new();
    let hits = Counter::<u64>::default();
    metrics.register("test", None, |r| r.register("hits", "Hits.", hits.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel();
    tokio::spawn(serve(listener, metrics, async {
        let _ = stopped.await;
    }));
    (addr, hits, stop)
}

/// Sends `request` raw and returns the reply's status line.
async fn status_line(addr: SocketAddr, request: &[u8]) -> String {
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before all of a long request is written.
    let _ = socket.write_all(request).await;
    let mut reply = Vec::new();
    let _ = socket.read_to_end(&mut reply).await;
    String::from_utf8_lossy(&reply).lines().next().unwrap_or_default().to_string()
}

#[tokio::test]
async fn scrapes_see_counters_move() {
    let (addr, hits, _stop) = start().await;
    let before = sum_of(&scrape(addr).await.unwrap(), "nasd_test_hits_total", &[]);
    hits.inc_by(3);
    let after = sum_of(&scrape(addr).await.unwrap(), "nasd_test_hits_total", &[]);
    assert_eq!(after - before, 3.0);
}

#[tokio::test]
async fn bad_requests_get_a_4xx_and_the_endpoint_goes_on() {
    let (addr, hits, _stop) = start().await;
    let long = format!("GET /metrics HTTP/1.1\r\nX-Long: {}\r\n\r\n", "a".repeat(2 * REQUEST_HEAD_MAX));
    let cases: [(&[u8], &str); 5] = [
        (b"\x16\x03\x01\x02\x00garbage\r\n\r\n", " 400 "),
        (b"GET /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", " 404 "),
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", " 405 "),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", " 200 "),
        (long.as_bytes(), " 431 "),
    ];
    for (request, want) in cases {
        let line = status_line(addr, request).await;
        assert!(line.contains(want), "{:?}: got {line:?}, want{want}", String::from_utf8_lossy(&request[..20]));
        hits.inc();
        let samples = scrape(addr).await.expect("still serving");
        assert!(sum_of(&samples, "nasd_test_hits_total", &[]) >= 1.0);
    }
}
