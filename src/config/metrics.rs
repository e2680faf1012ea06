//! `[metrics]`: the Prometheus endpoint and the web UI.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

use agent_r1_envs::access::{check_exposure, Access, AccessKeys};

use agent_r1_envs::config::Section;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// Serve `/metrics` and `/healthz`.
    pub enabled: bool,
    /// `HOST:PORT` to listen on. Anything but loopback needs `token_file`.
    pub address: String,
    /// File whose first line is the bearer token every request must carry
    /// (`Authorization: Bearer TOKEN`); required when `address` is not loopback.
    pub token_file: Option<PathBuf>,
    /// Paths served without the token, e.g. `["/metrics", "/healthz"]` for a Prometheus or
    /// a probe that cannot send one; `"/ui/*"` opens everything under `/ui/`.
    pub open_paths: Vec<String>,
    /// Longest a client may take to send its request headers, seconds.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 86400.0))]
    pub header_timeout_secs: f64,
    /// Longest a connection stays open, seconds (a scraper reconnects).
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 86400.0))]
    pub connection_timeout_secs: f64,
    /// Connections served at once; more are closed on arrival.
    #[schemars(range(min = 1))]
    pub max_connections: usize,
    /// `/healthz` answers 503 when nothing has progressed (no episode moved, no update, no
    /// warm-start step) for this many seconds.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 86400.0))]
    pub healthz_stale_secs: f64,
    /// Serve the web UI (`/ui`) on the same address; false keeps only `/metrics` and
    /// `/healthz` there (when `address` is reachable from other machines, say).
    pub ui: bool,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            enabled: true,
            address: "127.0.0.1:9464".into(),
            token_file: None,
            open_paths: vec![],
            header_timeout_secs: 10.0,
            connection_timeout_secs: 60.0,
            max_connections: 32,
            healthz_stale_secs: 900.0,
            ui: true,
        }
    }
}

/// The keys errors name, relative to `[metrics]`.
const KEYS: AccessKeys = AccessKeys {
    section: "metrics",
    address: "address",
    token_file: "token_file",
    open_paths: "open_paths",
};

impl Section for MetricsSection {
    fn rules(&self) -> Result<(), ConfigError> {
        let addr = self.resolve()?;
        if self.enabled {
            check_exposure(KEYS, addr, self.token_file.as_deref(), &self.open_paths)?;
        }
        Ok(())
    }
}

impl MetricsSection {
    /// Checks the section; errors name `metrics.KEY`.
    pub fn check(&self) -> Result<(), ConfigError> {
        Section::validate(self).map_err(|e| e.under("metrics"))
    }

    /// Who the endpoint admits: reads `token_file`; errors name `metrics.KEY`.
    pub fn access(&self) -> Result<Access, ConfigError> {
        let addr = self.socket_addr()?;
        Access::load(KEYS, addr, self.token_file.as_deref(), &self.open_paths)
            .map_err(|e| e.under("metrics"))
    }

    /// The address to bind, resolved (`localhost:9464` works); errors name `metrics.address`.
    pub fn socket_addr(&self) -> Result<SocketAddr, ConfigError> {
        self.resolve().map_err(|e| e.under("metrics"))
    }

    fn resolve(&self) -> Result<SocketAddr, ConfigError> {
        let bad = |why: &str| {
            ConfigError::range(
                "address",
                format!("{:?} ({why})", self.address),
                "HOST:PORT, e.g. \"127.0.0.1:9464\" or \"0.0.0.0:9464\"",
            )
        };
        if let Ok(addr) = self.address.parse::<SocketAddr>() {
            return Ok(addr);
        }
        let Some((_, port)) = self.address.rsplit_once(':') else {
            return Err(bad("no port"));
        };
        if port.parse::<u16>().is_err() {
            return Err(bad("the port is not a number in 0..=65535"));
        }
        match self.address.to_socket_addrs() {
            Ok(mut addrs) => addrs.next().ok_or_else(|| bad("the host has no address")),
            Err(e) => Err(bad(&format!("cannot resolve the host: {e}"))),
        }
    }
}
