//! The metrics endpoint over real TCP: `/metrics` shows what was recorded, `/healthz` is 200;
//! off loopback it wants its bearer token except on the paths configured open. Its own test
//! binary, because the recorder is global to the process.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[path = "support/http_get.rs"]
mod http_get;

use agent_r1::config::MetricsSection;
use agent_r1::metrics_server::{start, MetricsError, Progress};
use http_get::get_as;

const TOKEN: &str = "a1b2c3d4e5f6a7b8c9d0e1f2";

/// GET `path` with the test's bearer token, returning the status code and body.
fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    get_as(addr, path, Some(TOKEN))
}

#[test]
fn off_loopback_without_a_token_it_is_refused_before_it_starts() {
    for address in ["0.0.0.0:0", "[::]:0"] {
        let e = start(
            &MetricsSection {
                address: address.into(),
                ..Default::default()
            },
            None,
            None,
        )
        .unwrap_err();
        let line = e.to_string();
        assert!(matches!(e, MetricsError::Address(_)), "{line}");
        assert!(
            line.contains("`metrics.address`")
                && line.contains("metrics.token_file")
                && !line.contains('\n'),
            "one line naming both keys: {line}"
        );
    }
}

#[test]
fn serves_metrics_and_healthz_on_a_free_port() {
    let board = agent_r1_actors::runtime::LiveBoard::default();
    board.touch("update 7");
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let server = start(
        &MetricsSection {
            enabled: true,
            address: "0.0.0.0:0".into(),
            token_file: Some(token_file),
            open_paths: vec!["/healthz".into()],
            header_timeout_secs: 1.0,
            connection_timeout_secs: 3.0,
            max_connections: 4,
            healthz_stale_secs: 3600.0,
            ui: false,
        },
        None,
        Some(Progress {
            board: board.clone(),
            stalls: Default::default(),
        }),
    )
    .unwrap();
    assert_ne!(server.local_addr().port(), 0, "the real port is reported");
    let addr = SocketAddr::from(([127, 0, 0, 1], server.local_addr().port()));

    // Bound to every interface: the token is wanted, except on the path configured open.
    let (status, body) = get_as(addr, "/metrics", None);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("metrics.token_file"), "{body}");
    assert_eq!(
        get_as(addr, "/metrics", Some("a1b2c3d4e5f6a7b8c9d0e1f3")).0,
        401
    );
    assert_eq!(get_as(addr, "/nope", None).0, 401, "no route is told apart");
    assert_eq!(get_as(addr, "/healthz", None).0, 200, "configured open");

    metrics::counter!("agent_r1_test_total").increment(3);
    metrics::gauge!("agent_r1_episodes_in_flight").set(5.0);
    metrics::histogram!("agent_r1_tool_call_duration_seconds", "tool" => "search").record(0.02);

    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("agent_r1_test_total 3"), "{body}");
    assert!(body.contains("agent_r1_episodes_in_flight 5"), "{body}");
    for m in [
        agent_r1_actors::metric_names::EPISODES_IN_FLIGHT,
        agent_r1_actors::metric_names::TOOL_CALL_DURATION_SECONDS,
    ] {
        let help = format!("# HELP {} {}\n", m.name, m.help_text());
        assert!(
            body.contains(&help),
            "described series carry their declaration's help text ({help}): {body}"
        );
    }
    assert!(
        body.contains("agent_r1_tool_call_duration_seconds_bucket{tool=\"search\",le=\"0.025\"} 1"),
        "histograms are exported with buckets: {body}"
    );

    let (status, body) = get(addr, "/healthz");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.starts_with("ok: last progress") && body.contains("(update 7)"),
        "{body}"
    );
    assert_eq!(get(addr, "/nope").0, 404);

    // Clients that connect and send nothing cannot hold the server: past 4 connections
    // new ones are closed on arrival, the others when their headers are 1 s late. Every
    // one of 40 idle connections is closed by the server (the 60 s read timeout only
    // guards the test against a server that would keep them).
    let idle: Vec<TcpStream> = (0..40).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for (i, mut s) in idle.into_iter().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("idle connection {i} was not closed by the server: {other:?}"),
        }
    }
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "served again after the idle clients: {body}");
    assert!(
        body.contains("agent_r1_metrics_connections_refused_total"),
        "{body}"
    );

    // The recorder is per process: a second start says so.
    let again = start(
        &MetricsSection {
            enabled: true,
            address: "127.0.0.1:0".into(),
            ..Default::default()
        },
        None,
        None,
    );
    assert!(
        matches!(again, Err(MetricsError::AlreadyInstalled)),
        "{again:?}"
    );

    // Dropping the server stops the listener.
    drop(server);
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(2)).is_err());
}
