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
//!
//! The modules are layered, and a module imports only modules below it:
//! at the bottom the plain values ([`ids`], [`path`], [`context`],
//! [`duration`], [`limits`], [`quotas`]), then templates, errors and
//! retry policy, then the automation as written ([`definition`], which
//! imports nothing above these), then the records of a run ([`run`]) and
//! the step modules, each deciding one kind of step from its config, the
//! scope and the context ([`waits`], [`children`], [`compensation`],
//! [`for_each`], …; [`flow`] walks the tree through them, [`control`]
//! names the steps tok-core runs itself). The decider,
//! [`advance`](mod@advance), sits on top beside [`validate`](mod@validate):
//! it imports the step modules, never the reverse. A value that both the
//! decider and a step module need is defined in the step module (or in
//! [`run`]) and re-exported by `advance`. Doc links may point up; `use`
//! paths may not.

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
pub mod control;
pub mod custom_wait;
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
