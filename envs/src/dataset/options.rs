//! How a dataset file is read: its format, what to do with a bad row, which rows to keep.

use serde::{Deserialize, Serialize};

use super::format::DatasetFormat;

/// What to do with a row that does not fit the format.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum OnBadRow {
    /// Stop with [`crate::Error::BadRow`] (file and line): no silent data loss.
    #[default]
    Fail,
    /// Skip it, count it in [`super::Loaded::skipped`] and warn through `tracing`.
    Skip,
}

/// Options of [`super::load_tasks`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LoadOptions {
    /// The format; `None` detects it from the extension and the first row.
    pub format: Option<DatasetFormat>,
    /// Bad-row policy (`"fail"` or `"skip"`).
    pub on_bad_row: OnBadRow,
    /// Keep MuSiQue rows with `answerable: false` (dropped by default).
    pub include_unanswerable: bool,
    /// Keep at most this many tasks (after filtering).
    pub limit: Option<usize>,
}
