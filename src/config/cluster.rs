//! `[cluster]`: remote rollout workers (`agent-r1 worker --join`) on ractor_cluster, and the
//! weight server they fetch each policy version from.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agent_r1_envs::access::{check_exposure, Access, AccessKeys};
use agent_r1_envs::config::{ConfigError, Section};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `[cluster]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// `IP:PORT` where workers join (ractor_cluster's node server; port 0: any free port, and
    /// the trainer prints the address bound). Empty: no workers. The cookie authenticates;
    /// without `[cluster.tls]` nothing encrypts, so keep it on loopback or a trusted network.
    pub listen: String,
    /// File whose first line is the shared secret (cookie) a worker must present. Required
    /// with `listen`.
    pub cookie_file: Option<PathBuf>,
    /// `IP:PORT` of the weight server workers fetch versions from (port 0: any free port).
    /// Anything but loopback needs `weights_token_file`.
    pub weights_listen: String,
    /// File whose first line is the bearer token the weight server wants; required when
    /// `weights_listen` is not loopback. Workers are sent it when they join.
    pub weights_token_file: Option<PathBuf>,
    /// The URL workers use for the weight server, when it differs from the bound address
    /// (NAT, a DNS name). Default: `http://` + the bound address.
    pub weights_url: Option<String>,
    /// A lease runs out this many seconds after its grant or last renewal; its task then
    /// goes to another worker, and a worker silent this long is dropped.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 86400.0))]
    pub lease_secs: f64,
    /// How often workers renew their leases, seconds (at most half of `lease_secs`).
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 3600.0))]
    pub heartbeat_secs: f64,
    /// Sampling starts once this many workers have joined and fetched the run's weights.
    pub min_workers: usize,
    /// How long to wait for `min_workers`, seconds, before the run fails.
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 86400.0))]
    pub min_workers_timeout_secs: f64,
    /// Whether the trainer's own engines sample too (false: only workers do).
    pub local_rollout: bool,
    /// Policy versions kept on the weight server.
    #[schemars(range(min = 1))]
    pub keep_versions: usize,
    /// TLS for the cluster's connections (workers then join with `--tls-ca`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClusterTls>,
}

/// `[cluster.tls]`: the trainer's certificate and key, PEM.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterTls {
    /// The certificate chain (PEM); its names must include the address workers join.
    pub cert: PathBuf,
    /// The private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            listen: String::new(),
            cookie_file: None,
            weights_listen: "127.0.0.1:0".into(),
            weights_token_file: None,
            weights_url: None,
            lease_secs: 30.0,
            heartbeat_secs: 2.0,
            min_workers: 0,
            min_workers_timeout_secs: 600.0,
            local_rollout: true,
            keep_versions: 3,
            tls: None,
        }
    }
}

impl Section for ClusterSection {
    fn rules(&self) -> Result<(), ConfigError> {
        let addr = |key: &str, text: &str| {
            text.parse::<SocketAddr>().map_err(|_| {
                ConfigError::range(key, format!("{text:?}"), "IP:PORT, e.g. \"127.0.0.1:7700\"")
            })
        };
        let weights = addr("weights_listen", &self.weights_listen)?;
        if self.listen.is_empty() {
            if !self.local_rollout {
                return Err(ConfigError::range(
                    "local_rollout",
                    false,
                    "true unless `listen` is set (nothing else would sample)",
                ));
            }
            return Ok(());
        }
        addr("listen", &self.listen)?;
        check_exposure(
            WEIGHT_KEYS,
            weights,
            self.weights_token_file.as_deref(),
            &[],
        )?;
        if self.cookie_file.is_none() {
            return Err(ConfigError::new(
                "cookie_file",
                "required with `listen`: a file whose first line is the secret workers present",
            ));
        }
        if self.heartbeat_secs * 2.0 > self.lease_secs {
            return Err(ConfigError::range(
                "heartbeat_secs",
                self.heartbeat_secs,
                format!("at most lease_secs / 2 = {}", self.lease_secs / 2.0),
            ));
        }
        if !self.local_rollout && self.min_workers == 0 {
            return Err(ConfigError::range(
                "min_workers",
                0,
                ">= 1 with local_rollout = false (nothing would sample until a worker joins)",
            ));
        }
        Ok(())
    }
}

/// The weight server's keys, relative to `[cluster]`.
const WEIGHT_KEYS: AccessKeys = AccessKeys {
    section: "cluster",
    address: "weights_listen",
    token_file: "weights_token_file",
    open_paths: "",
};

impl ClusterSection {
    /// Who the weight server admits (reads `weights_token_file`); errors name keys
    /// relative to `[cluster]`.
    pub fn weights_access(&self) -> Result<Access, ConfigError> {
        let addr = self.weights_listen.parse::<SocketAddr>().map_err(|_| {
            ConfigError::range(
                "weights_listen",
                format!("{:?}", self.weights_listen),
                "IP:PORT",
            )
        })?;
        Access::load(WEIGHT_KEYS, addr, self.weights_token_file.as_deref(), &[])
    }

    /// Whether workers may join.
    pub fn enabled(&self) -> bool {
        !self.listen.is_empty()
    }

    /// The lease period.
    pub fn lease(&self) -> Duration {
        Duration::from_secs_f64(self.lease_secs)
    }

    /// The renewal period.
    pub fn heartbeat(&self) -> Duration {
        Duration::from_secs_f64(self.heartbeat_secs)
    }
}
