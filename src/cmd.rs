//! One module per subcommand.

pub(crate) mod bench;
pub(crate) mod generate;
pub(crate) mod init_model;
