//! The fault plan of a build without `fault-injection`: nothing to inject, so every moment
//! of a run where a fault could be injected does nothing.

use agent_r1_actors::engine::EngineFaults;
use agent_r1_actors::engine_set::EngineSet;
use agent_r1_actors::learner::BeforeUpdate;

use crate::train::scenario::Scenario;

/// No faults.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults;

impl Faults {
    pub(crate) fn any(&self) -> bool {
        false
    }

    pub(crate) fn apply_to_scenario(&self, _scenario: &mut Scenario) -> anyhow::Result<()> {
        Ok(())
    }

    pub(crate) fn before_update(&self) -> Option<BeforeUpdate> {
        None
    }

    pub(crate) fn rank_args(&self, _rank: usize) -> Vec<String> {
        Vec::new()
    }

    pub(crate) fn before_sampling(&self, _updates_done: u64, _engines: &EngineFaults) {}

    pub(crate) fn before_publication(&self, _engines: &EngineFaults) {}

    pub(crate) fn after_publication(
        &self,
        _updates_done: u64,
        _engines: &EngineFaults,
        _engine_set: &EngineSet,
    ) {
    }

    pub(crate) async fn during_checkpoint_write(
        &self,
        _step: u64,
        _holds_a_finished_step_or_nothing_running: impl Fn() -> bool,
    ) {
    }
}
