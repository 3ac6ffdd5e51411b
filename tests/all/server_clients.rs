//! Clients that would take the server down for everyone: connections that never send a
//! request, more of them than the server serves at once.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use sluice::server::{HEADER_TIMEOUT, MAX_CONNECTIONS};
use sluice_tests::test_dir;

use crate::server::{ServerProcess, host_config};

/// Connects to `url`'s address and sends the start of a request's head, never its end.
fn silent_client(address: &str) -> TcpStream {
    let mut stream = TcpStream::connect(address).expect("connecting");
    stream
        .write_all(b"GET /livez HTTP/1.1\r\nHost: sluice\r\n")
        .unwrap();
    stream
}

/// The server's open file descriptors.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// More silent clients than the server serves at once (a slowloris): each is closed once
/// it has not sent a request's head in time, those past the limit wait unaccepted, so
/// the server's open files stay bounded, and a client that asks is answered.
#[test]
fn silent_clients_are_closed_and_cannot_take_the_servers_file_descriptors() {
    let dir = test_dir("server-silent-clients");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let address = server.url.trim_start_matches("http://").to_string();
    let before = open_files(server.pid());
    let mut silent: Vec<TcpStream> = (0..MAX_CONNECTIONS + 100)
        .map(|_| silent_client(&address))
        .collect();
    let started = Instant::now();
    let mut asking = TcpStream::connect(&address).unwrap();
    asking
        .write_all(b"GET /livez HTTP/1.1\r\nHost: sluice\r\nConnection: close\r\n\r\n")
        .unwrap();
    let held = open_files(server.pid());
    assert!(
        held <= before + MAX_CONNECTIONS + 8,
        "{held} open files with {} silent clients (before them: {before})",
        silent.len()
    );
    asking.set_read_timeout(Some(4 * HEADER_TIMEOUT)).unwrap();
    let mut answer = String::new();
    asking.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    // Answered once the first silent clients were closed, not before.
    assert!(
        started.elapsed() >= HEADER_TIMEOUT / 2,
        "{:?}",
        started.elapsed()
    );
    // The first silent client was closed by the server.
    let first = &mut silent[0];
    first.set_read_timeout(Some(2 * HEADER_TIMEOUT)).unwrap();
    let mut rest = Vec::new();
    match first.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
}
