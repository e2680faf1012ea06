//! Metric declarations: every series agent-r1 records is declared once, with its kind, unit,
//! label keys and help text, in its crate's `metric_names` module. Recording sites name the
//! declaration (`metrics::counter!(TOOL_CALLS_TOTAL.name, "tool" => name)`), the metrics
//! server writes each declaration's help text into `/metrics`, and a test fails on a metric
//! name written anywhere else.

pub use metrics::Unit;

/// What a series is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up; the name ends in `_total`.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution, exported with explicit buckets.
    Histogram,
}

/// One declared series.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// The constant's name in its `metric_names` module (what recording sites write).
    pub ident: &'static str,
    /// The Prometheus name, `agent_r1_` prefixed.
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: MetricKind,
    /// Seconds or bytes where the series has a unit.
    pub unit: Option<Unit>,
    /// The label keys recording sites may attach.
    pub labels: &'static [&'static str],
    /// The `# HELP` text, from the declaration's doc comment.
    pub help: &'static str,
}

impl Metric {
    /// The help text without the doc comment's leading spaces.
    pub fn help_text(&self) -> String {
        self.help.split_whitespace().collect::<Vec<_>>().join(" ")
    }
}

/// Declares metric constants and the module's `ALL` table:
///
/// ```
/// mod metric_names {
///     agent_r1_envs::declare_metrics! {
///         /// Calls of each tool.
///         TOOL_CALLS_TOTAL: Counter("agent_r1_tool_calls_total") labels ["tool"];
///         /// Time per call.
///         TOOL_CALL_DURATION_SECONDS: Histogram("agent_r1_tool_call_duration_seconds", Seconds) labels ["tool"];
///     }
/// }
/// assert_eq!(metric_names::ALL.len(), 2);
/// assert_eq!(metric_names::TOOL_CALLS_TOTAL.help_text(), "Calls of each tool.");
/// ```
#[macro_export]
macro_rules! declare_metrics {
    ($(
        $(#[doc = $doc:literal])+
        $ident:ident : $kind:ident ( $name:literal $(, $unit:ident)? ) labels [ $($label:literal),* $(,)? ];
    )*) => {
        $(
            $(#[doc = $doc])+
            pub const $ident: $crate::metric::Metric = $crate::metric::Metric {
                ident: stringify!($ident),
                name: $name,
                kind: $crate::metric::MetricKind::$kind,
                unit: $crate::__metric_unit!($($unit)?),
                labels: &[$($label),*],
                help: concat!($($doc, " "),+),
            };
        )*
        /// Every series this module declares.
        pub const ALL: &[$crate::metric::Metric] = &[$($ident),*];
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __metric_unit {
    () => {
        None
    };
    ($unit:ident) => {
        Some($crate::metric::Unit::$unit)
    };
}
