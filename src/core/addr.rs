//! `HOST:PORT` as an operator writes it: an address (`10.0.0.7:7400`, `[::1]:7400`) or a host
//! name (`node017:7400`, from `scontrol show hostnames` or a Flux resource list), resolved once
//! when it is read, so that a peers file, `--listen` and a rendezvous entry take either.

use std::net::{SocketAddr, ToSocketAddrs};

/// `text` as a socket address: parsed if it is one, else its host resolved (the first IPv4
/// address, else the first; a name that resolves to several gives the one a connect would try
/// first). The error says which part is wrong, in a phrase to follow "is not an address: ".
pub fn socket_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Ok(a);
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err("no port (HOST:PORT, e.g. node017:7400 or 10.0.0.7:7400)".into());
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{port:?} is not a port (a number up to 65535)"))?;
    if host.is_empty() || host.contains(['[', ']', '/', ' ']) {
        return Err(format!("{host:?} is not a host name"));
    }
    let found: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("host name {host:?} does not resolve ({e})"))?
        .collect();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| format!("host name {host:?} resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_names_resolve_and_mistakes_say_which_part() {
        assert_eq!(
            socket_addr("127.0.0.1:7400").unwrap(),
            "127.0.0.1:7400".parse().unwrap()
        );
        assert_eq!(socket_addr("[::1]:7").unwrap(), "[::1]:7".parse().unwrap());
        let local = socket_addr("localhost:7400").unwrap();
        assert!(local.ip().is_loopback() && local.port() == 7400, "{local}");
        assert!(socket_addr("localhost").unwrap_err().contains("no port"));
        assert!(
            socket_addr("localhost:http")
                .unwrap_err()
                .contains("not a port")
        );
        assert!(
            socket_addr("localhost:70000")
                .unwrap_err()
                .contains("not a port")
        );
        let e = socket_addr("no-such-host.invalid:7400").unwrap_err();
        assert!(e.contains("does not resolve"), "{e}");
    }
}
