//! `[lora]` and `model.adapter`: which adapters the policy trains, checked against each other,
//! the cluster and (when it exists) the model's shapes before anything loads.

use agent_r1_actors::model::lora::{read_adapter_config, AdapterSource, LoraConfig};
use agent_r1_actors::model::ModelConfig;
use agent_r1_envs::config::Section;

use super::{ConfigError, FileCheck, TrainConfig};

impl TrainConfig {
    /// The adapters the run trains: `[lora]`'s fresh ones, or `model.adapter`'s; `None`
    /// trains the full weights.
    pub fn adapter_source(&self) -> Option<AdapterSource> {
        match (&self.lora, &self.model.adapter) {
            (_, Some(dir)) => Some(AdapterSource {
                config: self.lora.clone().unwrap_or_default(),
                from: Some(dir.clone()),
            }),
            (Some(config), None) => Some(AdapterSource {
                config: config.clone(),
                from: None,
            }),
            (None, None) => None,
        }
    }

    pub(super) fn check_lora(&self, files: FileCheck) -> Result<(), ConfigError> {
        if let Some(lora) = &self.lora {
            lora.rules().map_err(|e| e.under("lora"))?;
        }
        let Some(dir) = &self.model.adapter else {
            return self.check_rank(self.lora.as_ref(), files);
        };
        if files == FileCheck::Skip {
            return Ok(());
        }
        let saved = read_adapter_config(dir)
            .map_err(|e| ConfigError::new("model.adapter", e.to_string()))?;
        if let Some(lora) = &self.lora {
            let same = lora.rank == saved.rank
                && lora.alpha == saved.alpha
                && lora.use_rslora == saved.use_rslora
                && lora.target_modules.resolve().ok() == saved.target_modules.resolve().ok();
            if !same {
                return Err(ConfigError::new(
                    "lora",
                    format!(
                        "disagrees with model.adapter {} (rank {}, alpha {}, target_modules {:?}): remove [lora] to train with the adapter's settings",
                        dir.display(),
                        saved.rank,
                        saved.alpha,
                        saved.target_modules.resolve().unwrap_or_default()
                    ),
                ));
            }
        }
        self.check_rank(Some(&saved), files)
    }

    /// The rank against the narrowest targeted projection of `model.dir`'s config.
    fn check_rank(&self, lora: Option<&LoraConfig>, files: FileCheck) -> Result<(), ConfigError> {
        let (Some(lora), Some(dir), FileCheck::Require) = (lora, &self.model.dir, files) else {
            return Ok(());
        };
        let Ok((c, _)) = ModelConfig::from_file(&dir.join("config.json")) else {
            return Ok(()); // `model.dir`'s own check names what is wrong with it
        };
        match lora.rank_too_wide(&c) {
            Some((name, width)) => Err(ConfigError::range(
                "lora.rank",
                lora.rank,
                format!(
                    "1..={width} (`{name}` of {} is {width} wide on its narrower side)",
                    dir.display()
                ),
            )),
            None => Ok(()),
        }
    }
}
