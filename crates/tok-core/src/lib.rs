//! Pure definitions and decisions of tok: automations and their step trees,
//! the webhook params contract, the run context, templates, conditions, the
//! flow through a tree, the built-in steps, retry policy and validation —
//! and the one decider of a run, [`advance`], with the values its decisions
//! are made of ([`run`]) and the words of the incidents it raises
//! ([`incident`]).
//!
//! Nothing here does IO, awaits or reads the clock (except [`ids::new_id`],
//! which stamps ids with the current time): the engine passes in the tree, the
//! context and the time, and gets back what happens next as data.

pub mod advance;
pub mod approval;
pub mod blocked;
pub mod budget;
pub mod builtin;
pub mod children;
pub mod compensation;
pub mod condition;
pub mod condition_wait;
pub mod context;
pub mod contract;
pub mod definition;
pub mod duration;
pub mod error;
pub mod escalation;
pub mod fairness;
pub mod flow;
pub mod for_each;
pub mod ids;
pub mod incident;
pub mod limits;
pub mod parallel;
pub mod path;
pub mod progress;
pub mod quotas;
pub mod repeat;
pub mod retention;
pub mod retry;
pub mod run;
pub mod schedule;
pub mod start;
pub mod template;
pub mod uses;
pub mod validate;
pub mod waits;
pub mod walk;

pub use advance::{Input, RunState, Then, Transition, advance};
pub use builtin::{INTERNAL_TYPES, Outcome};
pub use condition::{Condition, Evaluation};
pub use context::{Context, Lookup};
pub use contract::{ContractError, Param, ParamType};
pub use definition::{
    Automation, DefinitionError, Filter, Match, Operator, Rule, Settings, Step, Trigger,
};
pub use duration::{DurationError, parse_duration};
pub use error::StepError;
pub use flow::{FlowError, Next};
pub use ids::{AutomationId, EventId, JobId, RunId, SourceId, TenantId, new_id};
pub use path::{Branch, FlowPath, PathError};
pub use retry::{Decision, RetryPolicy, decide};
pub use template::{RenderError, TemplateError};
pub use validate::{ValidationError, validate};
