//! One module per page.

pub(super) mod compare;
pub(super) mod episode;
pub(super) mod episodes;
pub(super) mod live;
pub(super) mod run;
