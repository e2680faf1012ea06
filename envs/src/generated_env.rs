//! The `GeneratedEnv` extension point: an env that makes its own tasks and can show how to
//! solve them.
//!
//! What a run from scratch needs from such an env: the tasks of each split, text for a
//! fresh tokenizer, and demonstrations for a supervised warm start. `train` asks for these
//! through this trait only, so a user's generator plugs in like a built-in one
//! (`EnvRegistry::register_generated`).

use crate::demo::{Demo, DemoConfig};
use crate::env::Env;
use crate::task::{Split, Task};

/// An env whose tasks come from a seeded generator rather than dataset files.
pub trait GeneratedEnv: Env {
    /// The tasks of a split, in a fixed order (the same options give the same tasks).
    fn tasks(&self, split: Split) -> Vec<Task>;

    /// Demonstrations of the training tasks, `config.variants()` per task in task order,
    /// each naming its task by id.
    fn demonstrations(&self, config: &DemoConfig) -> Vec<Demo>;

    /// Plain text a preset model's tokenizer is trained on: the env's vocabulary (documents,
    /// questions, worked answers) in the form the model will read and write it.
    fn tokenizer_text(&self) -> String;

    /// Words the tokenizer keeps whole (entity names), none by default.
    fn whole_words(&self) -> Vec<String> {
        Vec::new()
    }
}
