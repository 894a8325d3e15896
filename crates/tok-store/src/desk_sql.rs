//! The service-desk queries and the record transaction, written once for
//! both backends (see `rows.rs` for why a macro).

/// Most events one chain of automations may cause: an event deeper than
/// this is not written (loop protection, `docs/architecture.md`).
pub(crate) const MAX_EVENT_DEPTH: i32 = 5;

macro_rules! impl_desk {
    (
        store = $store:ty,
        db = $db:ty,
        conn = $conn:ty,
    ) => {
        use $crate::desk_sql::MAX_EVENT_DEPTH;

        const TICKET_SELECT: &str = "SELECT t.id, t.external_id, t.type_id, y.name AS type_name,
                t.title, t.status, t.closed, t.tags, t.fields, t.assignee_id,
                m.name AS assignee_name, t.created_at, t.updated_at
            FROM tickets t
            LEFT JOIN ticket_types y ON y.id = t.type_id
            LEFT JOIN members m ON m.id = t.assignee_id";

        fn ticket_from_row(row: &<$db as sqlx::Database>::Row) -> Ticket {
            let fields = match row.get::<Json<Value>, _>("fields").0 {
                Value::Object(map) => map,
                _ => serde_json::Map::new(),
            };
            Ticket {
                id: row.get("id"),
                external_id: row.get("external_id"),
                type_id: row.get("type_id"),
                type_name: row.get("type_name"),
                title: row.get("title"),
                status: row.get("status"),
                closed: row.get("closed"),
                tags: row.get::<Json<Vec<String>>, _>("tags").0,
                fields,
                assignee_id: row.get("assignee_id"),
                assignee_name: row.get("assignee_name"),
                created_at: row.get("created_at"),
                updated_at: row.get("updated_at"),
            }
        }

        fn ticket_type_from_row(row: &<$db as sqlx::Database>::Row) -> TicketType {
            TicketType {
                id: row.get("id"),
                name: row.get("name"),
                statuses: row.get::<Json<Vec<String>>, _>("statuses").0,
                fields: row.get::<Json<Value>, _>("fields").0,
                created_at: row.get("created_at"),
            }
        }

        fn incident_from_row(row: &<$db as sqlx::Database>::Row) -> Incident {
            Incident {
                id: row.get("id"),
                source: row.get("source"),
                title: row.get("title"),
                impact: row.get("impact"),
                detail: row.get::<Json<Value>, _>("detail").0,
                status: row.get("status"),
                run_id: row.get("run_id"),
                ticket_id: row.get("ticket_id"),
                occurrences: row.get("occurrences"),
                created_at: row.get("created_at"),
                updated_at: row.get("updated_at"),
                resolved_at: row.get("resolved_at"),
            }
        }

        /// A ticket by a unique column. `lock` (inside a record transaction)
        /// locks its row until the transaction ends, so a person's change
        /// cannot slip between a step's read and its write.
        async fn ticket_where(
            conn: &mut $conn,
            tenant: &TenantId,
            column: &str,
            value: &str,
            lock: bool,
        ) -> Result<Option<Ticket>> {
            let sql = if lock && !lock_rows!().is_empty() {
                // Lock only the ticket row, not the joined type and member.
                format!("{TICKET_SELECT} WHERE t.tenant_id = $1 AND t.{column} = $2 {} OF t", lock_rows!())
            } else {
                format!("{TICKET_SELECT} WHERE t.tenant_id = $1 AND t.{column} = $2")
            };
            let row = sqlx::query(&sql)
                .bind(tenant.as_str())
                .bind(value)
                .fetch_optional(&mut *conn)
                .await?;
            Ok(row.as_ref().map(ticket_from_row))
        }

        async fn group_in(
            conn: &mut $conn,
            tenant: &TenantId,
            name_or_id: Option<&str>,
        ) -> Result<Vec<Group>> {
            let groups = sqlx::query(
                "SELECT id, name FROM groups
                 WHERE tenant_id = $1 AND (CAST($2 AS TEXT) IS NULL OR id = $2 OR name = $2)
                 ORDER BY name",
            )
            .bind(tenant.as_str())
            .bind(name_or_id)
            .fetch_all(&mut *conn)
            .await?;
            let mut out = Vec::with_capacity(groups.len());
            for g in &groups {
                let id: String = g.get("id");
                let members = sqlx::query(
                    "SELECT id, name, capacity FROM members
                     WHERE tenant_id = $1 AND group_id = $2 ORDER BY position",
                )
                .bind(tenant.as_str())
                .bind(&id)
                .fetch_all(&mut *conn)
                .await?
                .iter()
                .map(|m| Member { id: m.get("id"), name: m.get("name"), capacity: m.get("capacity") })
                .collect();
                out.push(Group { id, name: g.get("name"), members });
            }
            Ok(out)
        }

        pub(crate) async fn trace_in(
            conn: &mut $conn,
            tenant: &TenantId,
            ticket_id: &str,
            kind: &str,
            message: &str,
            cause: &Cause,
        ) -> Result<()> {
            sqlx::query(
                "INSERT INTO ticket_trace (tenant_id, ticket_id, at, kind, message, run_id,
                    automation_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(tenant.as_str())
            .bind(ticket_id)
            .bind(now_ms())
            .bind(kind)
            .bind(message)
            .bind(cause.run_id.as_ref().map(|r| r.as_str()))
            .bind(cause.automation_id.as_ref().map(|a| a.as_str()))
            .execute(&mut *conn)
            .await?;
            Ok(())
        }

        /// Writes an internal event caused by `cause`, unless the chain is
        /// already as deep as allowed.
        async fn emit_in(
            conn: &mut $conn,
            tenant: &TenantId,
            event: NewInternalEvent,
            cause: &Cause,
        ) -> Result<Written> {
            let depth = cause.depth + 1;
            if depth > MAX_EVENT_DEPTH {
                tracing::warn!(
                    tenant = %tenant,
                    event = %event.event_type,
                    depth,
                    "event not written: the chain of automations is too deep"
                );
                return Ok(Written { event_id: None, too_deep: true });
            }
            let id = new_id("evt");
            sqlx::query(
                "INSERT INTO event_inbox (id, tenant_id, source_id, source_kind, idempotency_key,
                    payload, params, received_at, status, cause_run_id, depth,
                    origin_automation_id, event_type, subject_ticket_id)
                 VALUES ($1, $2, NULL, 'event', $1, $3, $4, $5, 'pending', $6, $7, $8, $9, $10)",
            )
            .bind(&id)
            .bind(tenant.as_str())
            .bind(Json(&event.payload))
            .bind(Json(serde_json::json!({})))
            .bind(now_ms())
            .bind(cause.run_id.as_ref().map(|r| r.as_str()))
            .bind(depth)
            .bind(cause.automation_id.as_ref().map(|a| a.as_str()))
            .bind(&event.event_type)
            .bind(event.subject_ticket_id.as_deref())
            .execute(&mut *conn)
            .await?;
            Ok(Written { event_id: Some(EventId::from(id)), too_deep: false })
        }

        async fn write_ticket_in(
            conn: &mut $conn,
            tenant: &TenantId,
            write: TicketWrite,
            expected_updated_at: Option<i64>,
            cause: &Cause,
        ) -> Result<Written> {
            let t = &write.ticket;
            if write.created {
                let inserted = sqlx::query(
                    "INSERT INTO tickets (id, tenant_id, external_id, type_id, title, status, closed,
                        tags, fields, assignee_id, created_at, updated_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
                     ON CONFLICT (tenant_id, external_id) DO NOTHING
                     RETURNING id",
                )
                .bind(&t.id)
                .bind(tenant.as_str())
                .bind(&t.external_id)
                .bind(t.type_id.as_deref())
                .bind(t.title.as_deref())
                .bind(t.status.as_deref())
                .bind(t.closed)
                .bind(Json(&t.tags))
                .bind(Json(&t.fields))
                .bind(t.assignee_id.as_deref())
                .bind(t.created_at)
                .bind(t.updated_at)
                .fetch_optional(&mut *conn)
                .await?;
                if inserted.is_none() {
                    return Err(StoreError::Taken(format!(
                        "a ticket with external id `{}` already exists",
                        t.external_id
                    )));
                }
            } else {
                let updated = sqlx::query(
                    "UPDATE tickets SET type_id = $3, title = $4, status = $5, closed = $6,
                        tags = $7, fields = $8, assignee_id = $9, updated_at = $10
                     WHERE tenant_id = $1 AND id = $2
                       AND (CAST($11 AS BIGINT) IS NULL OR updated_at = $11)",
                )
                .bind(tenant.as_str())
                .bind(&t.id)
                .bind(t.type_id.as_deref())
                .bind(t.title.as_deref())
                .bind(t.status.as_deref())
                .bind(t.closed)
                .bind(Json(&t.tags))
                .bind(Json(&t.fields))
                .bind(t.assignee_id.as_deref())
                .bind(t.updated_at)
                .bind(expected_updated_at)
                .execute(&mut *conn)
                .await?;
                if updated.rows_affected() == 0 {
                    return Err(StoreError::Changed(format!(
                        "ticket {} changed meanwhile; read it again and retry",
                        t.id
                    )));
                }
            }
            // The runs waiting for this ticket's condition learn its new
            // state in this transaction (`signals_sql.rs`).
            resume_condition_waits_in(&mut *conn, tenant, t).await?;
            let kind = if write.created { "created" } else { "updated" };
            for line in &write.trace {
                trace_in(conn, tenant, &t.id, kind, line, cause).await?;
            }
            let event = NewInternalEvent {
                event_type: format!("ticket.{kind}"),
                payload: serde_json::json!({ "ticket": t.event_view(), "changes": write.changes }),
                subject_ticket_id: Some(t.id.clone()),
            };
            let written = emit_in(conn, tenant, event, cause).await?;
            if written.too_deep {
                let message = format!(
                    "No automation was triggered by this change: the chain of automations is \
                     deeper than {MAX_EVENT_DEPTH} (loop protection)"
                );
                trace_in(conn, tenant, &t.id, "loop_protection", &message, cause).await?;
            }
            Ok(written)
        }

        async fn open_incident_in(
            conn: &mut $conn,
            tenant: &TenantId,
            incident: NewIncident,
        ) -> Result<(String, bool)> {
            let now = now_ms();
            let id = new_id("inc");
            let inserted = sqlx::query(
                "INSERT INTO incidents (id, tenant_id, source, title, impact, detail, status, run_id,
                    ticket_id, occurrences, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, 'open', $7, $8, 1, $9, $9)
                 ON CONFLICT (tenant_id, source) WHERE status = 'open' DO NOTHING
                 RETURNING id",
            )
            .bind(&id)
            .bind(tenant.as_str())
            .bind(&incident.source)
            .bind(&incident.title)
            .bind(&incident.impact)
            .bind(Json(&incident.detail))
            .bind(incident.run_id.as_ref().map(|r| r.as_str()))
            .bind(incident.ticket_id.as_deref())
            .bind(now)
            .fetch_optional(&mut *conn)
            .await?;
            if inserted.is_some() {
                return Ok((id, true));
            }
            let existing = sqlx::query(
                "UPDATE incidents SET occurrences = occurrences + 1, updated_at = $3
                 WHERE tenant_id = $1 AND source = $2 AND status = 'open'
                 RETURNING id",
            )
            .bind(tenant.as_str())
            .bind(&incident.source)
            .bind(now)
            .fetch_one(&mut *conn)
            .await?;
            Ok((existing.get("id"), false))
        }

        /// Locks the tenant's group `id` until the transaction ends,
        /// serialized with its assignments (`lock_group!`); its id and name,
        /// or `None` when the tenant has no such group.
        async fn lock_group_in(
            conn: &mut $conn,
            tenant: &TenantId,
            id: &str,
        ) -> Result<Option<(String, String)>> {
            let row = sqlx::query(concat!(
                "SELECT id, name FROM groups WHERE tenant_id = $1 AND id = $2 ",
                lock_rows!()
            ))
            .bind(tenant.as_str())
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
            let Some(row) = row else {
                return Ok(None);
            };
            let id: String = row.get("id");
            sqlx::query(lock_group!(1)).bind(&id).execute(&mut *conn).await?;
            Ok(Some((id, row.get("name"))))
        }

        /// The members of the group `group_id`, in order, with their open
        /// tickets.
        async fn member_loads_in(
            conn: &mut $conn,
            tenant: &TenantId,
            group_id: &str,
        ) -> Result<Vec<MemberLoad>> {
            let rows = sqlx::query(
                "SELECT m.id, m.name, m.capacity,
                    (SELECT COUNT(*) FROM tickets t
                     WHERE t.tenant_id = m.tenant_id AND t.assignee_id = m.id
                       AND NOT t.closed) AS open_tickets
                 FROM members m
                 WHERE m.tenant_id = $1 AND m.group_id = $2
                 ORDER BY m.position",
            )
            .bind(tenant.as_str())
            .bind(group_id)
            .fetch_all(&mut *conn)
            .await?;
            Ok(rows
                .iter()
                .map(|r| MemberLoad {
                    member: Member { id: r.get("id"), name: r.get("name"), capacity: r.get("capacity") },
                    open_tickets: r.get("open_tickets"),
                })
                .collect())
        }

        /// What keeps `members` from being removed: those of them with open
        /// tickets.
        fn held_by(members: &[&MemberLoad]) -> Vec<HeldBy> {
            members
                .iter()
                .filter(|m| m.open_tickets > 0)
                .map(|m| HeldBy {
                    id: m.member.id.clone(),
                    name: m.member.name.clone(),
                    tickets: m.open_tickets,
                })
                .collect()
        }

        /// Removes a member who holds no open ticket: the closed tickets
        /// they had are unassigned, each with a trace line that names them
        /// (a ticket names its assignee by id alone).
        async fn remove_member_in(
            conn: &mut $conn,
            tenant: &TenantId,
            member: &Member,
            group_name: &str,
        ) -> Result<()> {
            let now = now_ms();
            let message = format!(
                "Unassigned: {} was removed from group {group_name}",
                member.name
            );
            sqlx::query(
                "INSERT INTO ticket_trace (tenant_id, ticket_id, at, kind, message, run_id,
                    automation_id)
                 SELECT tenant_id, id, $3, 'updated', $4, NULL, NULL FROM tickets
                 WHERE tenant_id = $1 AND assignee_id = $2",
            )
            .bind(tenant.as_str())
            .bind(&member.id)
            .bind(now)
            .bind(&message)
            .execute(&mut *conn)
            .await?;
            sqlx::query(
                "UPDATE tickets SET assignee_id = NULL,
                    updated_at = CASE WHEN updated_at >= $3 THEN updated_at + 1 ELSE $3 END
                 WHERE tenant_id = $1 AND assignee_id = $2",
            )
            .bind(tenant.as_str())
            .bind(&member.id)
            .bind(now)
            .execute(&mut *conn)
            .await?;
            sqlx::query("DELETE FROM members WHERE tenant_id = $1 AND id = $2")
                .bind(tenant.as_str())
                .bind(&member.id)
                .execute(&mut *conn)
                .await?;
            Ok(())
        }

        #[async_trait::async_trait]
        impl DeskStore for $store {
            async fn create_ticket_type(
                &self,
                tenant: &TenantId,
                new: NewTicketType,
            ) -> Result<TicketType> {
                let t = TicketType {
                    id: new_id("typ"),
                    name: new.name,
                    statuses: new.statuses,
                    fields: new.fields,
                    created_at: now_ms(),
                };
                let inserted = sqlx::query(
                    "INSERT INTO ticket_types (id, tenant_id, name, statuses, fields, created_at)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (tenant_id, name) DO NOTHING RETURNING id",
                )
                .bind(&t.id)
                .bind(tenant.as_str())
                .bind(&t.name)
                .bind(Json(&t.statuses))
                .bind(Json(&t.fields))
                .bind(t.created_at)
                .fetch_optional(&*self.writer().await)
                .await?;
                match inserted {
                    Some(_) => Ok(t),
                    None => Err(StoreError::Taken(format!(
                        "a ticket type named `{}` already exists",
                        t.name
                    ))),
                }
            }

            async fn ticket_types(&self, tenant: &TenantId) -> Result<Vec<TicketType>> {
                let rows = sqlx::query(
                    "SELECT id, name, statuses, fields, created_at FROM ticket_types
                     WHERE tenant_id = $1 ORDER BY name",
                )
                .bind(tenant.as_str())
                .fetch_all(self.reader())
                .await?;
                Ok(rows.iter().map(ticket_type_from_row).collect())
            }

            async fn ticket_types_page(
                &self,
                tenant: &TenantId,
                limit: u32,
                after: Option<&str>,
            ) -> Result<Page<TicketType>> {
                let rows = sqlx::query(
                    "SELECT id, name, statuses, fields, created_at FROM ticket_types
                     WHERE tenant_id = $1 AND (CAST($2 AS TEXT) IS NULL OR name > $2)
                     ORDER BY name LIMIT $3",
                )
                .bind(tenant.as_str())
                .bind(after)
                .bind(i64::from(limit) + 1)
                .fetch_all(self.reader())
                .await?;
                let items = rows.iter().map(ticket_type_from_row).collect();
                Ok(Page::of(items, limit, |t: &TicketType| t.name.clone()))
            }

            async fn create_group(&self, tenant: &TenantId, new: NewGroup) -> Result<Group> {
                let now = now_ms();
                let group = Group {
                    id: new_id("grp"),
                    name: new.name,
                    members: new
                        .members
                        .into_iter()
                        .map(|(name, capacity)| Member { id: new_id("mem"), name, capacity })
                        .collect(),
                };
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let inserted = sqlx::query(
                    "INSERT INTO groups (id, tenant_id, name, created_at) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (tenant_id, name) DO NOTHING RETURNING id",
                )
                .bind(&group.id)
                .bind(tenant.as_str())
                .bind(&group.name)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
                if inserted.is_none() {
                    return Err(StoreError::Taken(format!(
                        "a group named `{}` already exists",
                        group.name
                    )));
                }
                for (position, m) in group.members.iter().enumerate() {
                    sqlx::query(
                        "INSERT INTO members (id, tenant_id, group_id, name, capacity, position,
                            created_at)
                         VALUES ($1, $2, $3, $4, $5, $6, $7)",
                    )
                    .bind(&m.id)
                    .bind(tenant.as_str())
                    .bind(&group.id)
                    .bind(&m.name)
                    .bind(m.capacity)
                    .bind(position as i32)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(group)
            }

            async fn ticket_type(
                &self,
                tenant: &TenantId,
                name_or_id: &str,
            ) -> Result<Option<TicketType>> {
                let row = sqlx::query(
                    "SELECT id, name, statuses, fields, created_at FROM ticket_types
                     WHERE tenant_id = $1 AND (id = $2 OR name = $2)",
                )
                .bind(tenant.as_str())
                .bind(name_or_id)
                .fetch_optional(self.reader())
                .await?;
                Ok(row.as_ref().map(ticket_type_from_row))
            }

            async fn update_ticket_type(
                &self,
                tenant: &TenantId,
                id: &str,
                patch: TicketTypePatch,
            ) -> Result<DeskChange<TicketType>> {
                // Every refusal rolls back before it answers (a dropped
                // transaction holds its locks until its connection is next used).
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let row = sqlx::query(concat!(
                    "SELECT id, name, statuses, fields, created_at FROM ticket_types
                     WHERE tenant_id = $1 AND id = $2 ", lock_rows!()
                ))
                .bind(tenant.as_str())
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(current) = row.as_ref().map(ticket_type_from_row) else {
                    tx.rollback().await?;
                    return Ok(DeskChange::NotFound);
                };
                if let Some(statuses) = &patch.statuses {
                    let held: Vec<HeldBy> = sqlx::query(
                        "SELECT status, COUNT(*) AS n FROM tickets
                         WHERE tenant_id = $1 AND type_id = $2 AND NOT closed AND status IS NOT NULL
                         GROUP BY status ORDER BY status",
                    )
                    .bind(tenant.as_str())
                    .bind(id)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|r| (r.get::<String, _>("status"), r.get::<i64, _>("n")))
                    .filter(|(status, _)| !statuses.contains(status))
                    .map(|(status, n)| HeldBy { id: status.clone(), name: status, tickets: n })
                    .collect();
                    if !held.is_empty() {
                        tx.rollback().await?;
                        return Ok(DeskChange::Held(held));
                    }
                }
                let changed = TicketType {
                    statuses: patch.statuses.unwrap_or(current.statuses),
                    fields: patch.fields.unwrap_or(current.fields),
                    ..current
                };
                sqlx::query(
                    "UPDATE ticket_types SET statuses = $3, fields = $4
                     WHERE tenant_id = $1 AND id = $2",
                )
                .bind(tenant.as_str())
                .bind(id)
                .bind(Json(&changed.statuses))
                .bind(Json(&changed.fields))
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(DeskChange::Done(changed))
            }

            async fn delete_ticket_type(
                &self,
                tenant: &TenantId,
                id: &str,
            ) -> Result<DeskChange<()>> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let row = sqlx::query(concat!(
                    "SELECT name FROM ticket_types WHERE tenant_id = $1 AND id = $2 ",
                    lock_rows!()
                ))
                .bind(tenant.as_str())
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(row) = row else {
                    tx.rollback().await?;
                    return Ok(DeskChange::NotFound);
                };
                let tickets: i64 = sqlx::query(
                    "SELECT COUNT(*) AS n FROM tickets WHERE tenant_id = $1 AND type_id = $2",
                )
                .bind(tenant.as_str())
                .bind(id)
                .fetch_one(&mut *tx)
                .await?
                .get("n");
                if tickets > 0 {
                    tx.rollback().await?;
                    return Ok(DeskChange::Held(vec![HeldBy {
                        id: id.to_owned(),
                        name: row.get("name"),
                        tickets,
                    }]));
                }
                sqlx::query("DELETE FROM ticket_types WHERE tenant_id = $1 AND id = $2")
                    .bind(tenant.as_str())
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(DeskChange::Done(()))
            }

            async fn group(&self, tenant: &TenantId, name_or_id: &str) -> Result<Option<Group>> {
                let mut conn = self.reader().acquire().await?;
                // An id of one group that is another's name: the id wins.
                let mut groups = group_in(&mut conn, tenant, Some(name_or_id)).await?;
                let by_id = groups.iter().position(|g| g.id == name_or_id);
                Ok(match by_id {
                    Some(at) => Some(groups.swap_remove(at)),
                    None => groups.pop(),
                })
            }

            async fn add_member(
                &self,
                tenant: &TenantId,
                group_id: &str,
                name: &str,
                capacity: i32,
            ) -> Result<Option<Member>> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let Some((group_id, group_name)) = lock_group_in(&mut tx, tenant, group_id).await? else {
                    tx.rollback().await?;
                    return Ok(None);
                };
                let members = member_loads_in(&mut tx, tenant, &group_id).await?;
                if members.iter().any(|m| m.member.name == name) {
                    tx.rollback().await?;
                    return Err(StoreError::Taken(format!(
                        "group `{group_name}` already has a member named `{name}`"
                    )));
                }
                let position: i32 = sqlx::query(
                    "SELECT COALESCE(MAX(position), -1) + 1 AS p FROM members
                     WHERE tenant_id = $1 AND group_id = $2",
                )
                .bind(tenant.as_str())
                .bind(&group_id)
                .fetch_one(&mut *tx)
                .await?
                .get("p");
                let member = Member { id: new_id("mem"), name: name.to_owned(), capacity };
                sqlx::query(
                    "INSERT INTO members (id, tenant_id, group_id, name, capacity, position, created_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(&member.id)
                .bind(tenant.as_str())
                .bind(&group_id)
                .bind(&member.name)
                .bind(member.capacity)
                .bind(position)
                .bind(now_ms())
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(Some(member))
            }

            async fn update_member(
                &self,
                tenant: &TenantId,
                group_id: &str,
                member_id: &str,
                capacity: i32,
            ) -> Result<Option<Member>> {
                let row = sqlx::query(
                    "UPDATE members SET capacity = $4
                     WHERE tenant_id = $1 AND group_id = $2 AND id = $3
                     RETURNING id, name, capacity",
                )
                .bind(tenant.as_str())
                .bind(group_id)
                .bind(member_id)
                .bind(capacity)
                .fetch_optional(&*self.writer().await)
                .await?;
                Ok(row.map(|m| Member { id: m.get("id"), name: m.get("name"), capacity: m.get("capacity") }))
            }

            async fn delete_member(
                &self,
                tenant: &TenantId,
                group_id: &str,
                member_id: &str,
            ) -> Result<DeskChange<()>> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let Some((group_id, group_name)) = lock_group_in(&mut tx, tenant, group_id).await? else {
                    tx.rollback().await?;
                    return Ok(DeskChange::NotFound);
                };
                let members = member_loads_in(&mut tx, tenant, &group_id).await?;
                let Some(load) = members.iter().find(|m| m.member.id == member_id) else {
                    tx.rollback().await?;
                    return Ok(DeskChange::NotFound);
                };
                let held = held_by(&[load]);
                if !held.is_empty() {
                    tx.rollback().await?;
                    return Ok(DeskChange::Held(held));
                }
                remove_member_in(&mut tx, tenant, &load.member, &group_name).await?;
                tx.commit().await?;
                Ok(DeskChange::Done(()))
            }

            async fn set_members(
                &self,
                tenant: &TenantId,
                group_id: &str,
                members: Vec<(String, i32)>,
            ) -> Result<DeskChange<Group>> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let Some((group_id, group_name)) = lock_group_in(&mut tx, tenant, group_id).await? else {
                    tx.rollback().await?;
                    return Ok(DeskChange::NotFound);
                };
                let current = member_loads_in(&mut tx, tenant, &group_id).await?;
                let leaving: Vec<&MemberLoad> = current
                    .iter()
                    .filter(|m| !members.iter().any(|(name, _)| *name == m.member.name))
                    .collect();
                let held = held_by(&leaving);
                if !held.is_empty() {
                    tx.rollback().await?;
                    return Ok(DeskChange::Held(held));
                }
                for load in &leaving {
                    remove_member_in(&mut tx, tenant, &load.member, &group_name).await?;
                }
                let now = now_ms();
                let mut kept = Vec::with_capacity(members.len());
                for (position, (name, capacity)) in members.into_iter().enumerate() {
                    match current.iter().find(|m| m.member.name == name) {
                        Some(load) => {
                            sqlx::query(
                                "UPDATE members SET capacity = $3, position = $4
                                 WHERE tenant_id = $1 AND id = $2",
                            )
                            .bind(tenant.as_str())
                            .bind(&load.member.id)
                            .bind(capacity)
                            .bind(position as i32)
                            .execute(&mut *tx)
                            .await?;
                            kept.push(Member { id: load.member.id.clone(), name, capacity });
                        }
                        None => {
                            let member = Member { id: new_id("mem"), name, capacity };
                            sqlx::query(
                                "INSERT INTO members (id, tenant_id, group_id, name, capacity,
                                    position, created_at)
                                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                            )
                            .bind(&member.id)
                            .bind(tenant.as_str())
                            .bind(&group_id)
                            .bind(&member.name)
                            .bind(member.capacity)
                            .bind(position as i32)
                            .bind(now)
                            .execute(&mut *tx)
                            .await?;
                            kept.push(member);
                        }
                    }
                }
                tx.commit().await?;
                Ok(DeskChange::Done(Group { id: group_id, name: group_name, members: kept }))
            }

            async fn delete_group(&self, tenant: &TenantId, id: &str) -> Result<DeskChange<()>> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let Some((group_id, group_name)) = lock_group_in(&mut tx, tenant, id).await? else {
                    tx.rollback().await?;
                    return Ok(DeskChange::NotFound);
                };
                let members = member_loads_in(&mut tx, tenant, &group_id).await?;
                let held = held_by(&members.iter().collect::<Vec<_>>());
                if !held.is_empty() {
                    tx.rollback().await?;
                    return Ok(DeskChange::Held(held));
                }
                for load in &members {
                    remove_member_in(&mut tx, tenant, &load.member, &group_name).await?;
                }
                sqlx::query("DELETE FROM groups WHERE tenant_id = $1 AND id = $2")
                    .bind(tenant.as_str())
                    .bind(&group_id)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(DeskChange::Done(()))
            }

            async fn groups(&self, tenant: &TenantId) -> Result<Vec<Group>> {
                let mut conn = self.reader().acquire().await?;
                group_in(&mut conn, tenant, None).await
            }

            async fn groups_page(
                &self,
                tenant: &TenantId,
                limit: u32,
                after: Option<&str>,
            ) -> Result<Page<Group>> {
                let mut conn = self.reader().acquire().await?;
                let names: Vec<String> = sqlx::query(
                    "SELECT name FROM groups
                     WHERE tenant_id = $1 AND (CAST($2 AS TEXT) IS NULL OR name > $2)
                     ORDER BY name LIMIT $3",
                )
                .bind(tenant.as_str())
                .bind(after)
                .bind(i64::from(limit) + 1)
                .fetch_all(&mut *conn)
                .await?
                .iter()
                .map(|r| r.get("name"))
                .collect();
                let mut items = Vec::with_capacity(names.len());
                for name in &names {
                    items.extend(group_in(&mut conn, tenant, Some(name)).await?);
                }
                Ok(Page::of(items, limit, |g: &Group| g.name.clone()))
            }

            async fn tickets(
                &self,
                tenant: &TenantId,
                filter: &TicketFilter,
                limit: u32,
                cursor: Option<&str>,
            ) -> Result<Page<Ticket>> {
                let sql = format!(
                    "{TICKET_SELECT}
                     WHERE t.tenant_id = $1
                       AND (CAST($2 AS TEXT) IS NULL OR t.status = $2)
                       AND (CAST($3 AS INTEGER) IS NULL OR t.closed = (CAST($3 AS INTEGER) = 1))
                       AND (CAST($4 AS TEXT) IS NULL OR y.name = $4)
                       AND (CAST($5 AS TEXT) IS NULL OR t.assignee_id = $5)
                       AND (CAST($6 AS TEXT) IS NULL OR CAST(t.tags AS TEXT) LIKE '%' || $6 || '%' ESCAPE '\\')
                       AND (CAST($7 AS TEXT) IS NULL OR t.external_id = $7)
                       AND (CAST($8 AS TEXT) IS NULL OR t.id < $8)
                     ORDER BY t.id DESC
                     LIMIT $9"
                );
                // The tag as it appears in the JSON text, with LIKE's
                // wildcards escaped.
                let tag_json = filter.tag.as_ref().map(|t| {
                    serde_json::to_string(t)
                        .unwrap_or_default()
                        .replace('\\', "\\\\")
                        .replace('%', "\\%")
                        .replace('_', "\\_")
                });
                let rows = sqlx::query(&sql)
                    .bind(tenant.as_str())
                    .bind(filter.status.as_deref())
                    .bind(filter.closed.map(i32::from))
                    .bind(filter.type_name.as_deref())
                    .bind(filter.assignee_id.as_deref())
                    .bind(tag_json.as_deref())
                    .bind(filter.external_id.as_deref())
                    .bind(cursor)
                    .bind(i64::from(limit) + 1)
                    .fetch_all(self.reader())
                    .await?;
                let mut items: Vec<Ticket> = rows.iter().map(ticket_from_row).collect();
                let next_cursor = if items.len() > limit as usize {
                    items.truncate(limit as usize);
                    items.last().map(|t| t.id.clone())
                } else {
                    None
                };
                Ok(Page { items, next_cursor })
            }

            async fn ticket(&self, tenant: &TenantId, id: &str) -> Result<Option<Ticket>> {
                let mut conn = self.reader().acquire().await?;
                ticket_where(&mut conn, tenant, "id", id, false).await
            }

            async fn ticket_trace(&self, tenant: &TenantId, id: &str) -> Result<Vec<TraceLine>> {
                let rows = sqlx::query(
                    "SELECT at, kind, message, run_id, automation_id FROM ticket_trace
                     WHERE tenant_id = $1 AND ticket_id = $2 ORDER BY id",
                )
                .bind(tenant.as_str())
                .bind(id)
                .fetch_all(self.reader())
                .await?;
                Ok(rows
                    .iter()
                    .map(|r| TraceLine {
                        at: r.get("at"),
                        kind: r.get("kind"),
                        message: r.get("message"),
                        run_id: r.get("run_id"),
                        automation_id: r.get("automation_id"),
                    })
                    .collect())
            }

            async fn delete_ticket(
                &self,
                tenant: &TenantId,
                id: &str,
            ) -> Result<$crate::desk::TicketDeletion> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let done = $crate::desk::delete_ticket_in(&mut tx, tenant, id).await?;
                tx.commit().await?;
                Ok(done)
            }

            async fn write_ticket(
                &self,
                tenant: &TenantId,
                write: TicketWrite,
                expected_updated_at: Option<i64>,
                cause: &Cause,
            ) -> Result<Written> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                let written = write_ticket_in(&mut tx, tenant, write, expected_updated_at, cause).await?;
                tx.commit().await?;
                Ok(written)
            }

            async fn incidents(
                &self,
                tenant: &TenantId,
                status: Option<&str>,
                limit: u32,
                cursor: Option<&str>,
            ) -> Result<Page<Incident>> {
                let rows = sqlx::query(
                    "SELECT * FROM incidents
                     WHERE tenant_id = $1
                       AND (CAST($2 AS TEXT) IS NULL OR status = $2)
                       AND (CAST($3 AS TEXT) IS NULL OR id < $3)
                     ORDER BY id DESC
                     LIMIT $4",
                )
                .bind(tenant.as_str())
                .bind(status)
                .bind(cursor)
                .bind(i64::from(limit) + 1)
                .fetch_all(self.reader())
                .await?;
                let mut items: Vec<Incident> = rows.iter().map(incident_from_row).collect();
                let next_cursor = if items.len() > limit as usize {
                    items.truncate(limit as usize);
                    items.last().map(|i| i.id.clone())
                } else {
                    None
                };
                Ok(Page { items, next_cursor })
            }

            async fn incident(&self, tenant: &TenantId, id: &str) -> Result<Option<Incident>> {
                let row = sqlx::query("SELECT * FROM incidents WHERE tenant_id = $1 AND id = $2")
                    .bind(tenant.as_str())
                    .bind(id)
                    .fetch_optional(self.reader())
                    .await?;
                Ok(row.as_ref().map(incident_from_row))
            }

            async fn resolve_incident(&self, tenant: &TenantId, id: &str) -> Result<bool> {
                let done = sqlx::query(
                    "UPDATE incidents SET status = 'resolved', resolved_at = $3, updated_at = $3
                     WHERE tenant_id = $1 AND id = $2 AND status = 'open'",
                )
                .bind(tenant.as_str())
                .bind(id)
                .bind(now_ms())
                .execute(&*self.writer().await)
                .await?;
                Ok(done.rows_affected() > 0)
            }
        }

        /// The open record transaction of one claimed job.
        pub(crate) struct OpenRecord {
            tx: sqlx::Transaction<'static, $db>,
            job: ClaimedJob,
            /// The run under the fence (its row stays locked on
            /// PostgreSQL; SQLite's one writer serves this transaction alone).
            status: $crate::rows::Fenced,
        }

        #[async_trait::async_trait]
        impl RecordTx for OpenRecord {
            async fn ticket(&mut self, id: &str) -> Result<Option<Ticket>> {
                ticket_where(&mut self.tx, &self.job.tenant_id, "id", id, true).await
            }

            async fn ticket_exists(&mut self, id: &str) -> Result<bool> {
                let found = sqlx::query("SELECT 1 FROM tickets WHERE tenant_id = $1 AND id = $2")
                    .bind(self.job.tenant_id.as_str())
                    .bind(id)
                    .fetch_optional(&mut *self.tx)
                    .await?;
                Ok(found.is_some())
            }

            async fn ticket_by_external_id(&mut self, external_id: &str) -> Result<Option<Ticket>> {
                ticket_where(&mut self.tx, &self.job.tenant_id, "external_id", external_id, true).await
            }

            async fn ticket_type(&mut self, name_or_id: &str) -> Result<Option<TicketType>> {
                let row = sqlx::query(
                    "SELECT id, name, statuses, fields, created_at FROM ticket_types
                     WHERE tenant_id = $1 AND (id = $2 OR name = $2)",
                )
                .bind(self.job.tenant_id.as_str())
                .bind(name_or_id)
                .fetch_optional(&mut *self.tx)
                .await?;
                Ok(row.as_ref().map(ticket_type_from_row))
            }

            async fn group(&mut self, name_or_id: &str) -> Result<Option<Group>> {
                let mut groups = group_in(&mut self.tx, &self.job.tenant_id, Some(name_or_id)).await?;
                Ok(groups.pop())
            }

            async fn member_loads(&mut self, group_id: &str) -> Result<Vec<MemberLoad>> {
                // Assignments to one group are serialized until this
                // transaction ends, so two runs assigning at once do not both
                // see the same member as least busy.
                sqlx::query(lock_group!(1))
                    .bind(group_id)
                    .execute(&mut *self.tx)
                    .await?;
                member_loads_in(&mut self.tx, &self.job.tenant_id, group_id).await
            }

            async fn write_ticket(&mut self, write: TicketWrite, cause: &Cause) -> Result<Written> {
                write_ticket_in(&mut self.tx, &self.job.tenant_id, write, None, cause).await
            }

            async fn trace(
                &mut self,
                ticket_id: &str,
                kind: &str,
                message: &str,
                cause: &Cause,
            ) -> Result<()> {
                trace_in(&mut self.tx, &self.job.tenant_id, ticket_id, kind, message, cause).await
            }

            async fn emit(&mut self, event: NewInternalEvent, cause: &Cause) -> Result<Written> {
                emit_in(&mut self.tx, &self.job.tenant_id, event, cause).await
            }

            async fn send_signal(&mut self, signal: NewSignal) -> Result<SignalSent> {
                send_signal_in(&mut self.tx, &self.job.tenant_id, &signal).await
            }

            async fn open_incident(&mut self, incident: NewIncident) -> Result<(String, bool)> {
                open_incident_in(&mut self.tx, &self.job.tenant_id, incident).await
            }

            async fn run_steps(&mut self) -> Result<Vec<StepRow>> {
                steps_of(&mut *self.tx, &self.job.tenant_id, &self.job.run_id).await
            }

            async fn automation_named(&mut self, id_or_name: &str) -> Result<Option<AutomationRow>> {
                automation_named(&mut self.tx, &self.job.tenant_id, id_or_name).await
            }

            async fn start_child(&mut self, event: NewEvent, run: NewRun) -> Result<ChildStart> {
                $crate::storable::check_event(&event)?;
                start_child_in(&mut self.tx, &self.job.tenant_id, &self.job.run_id, &event, &run).await
            }

            async fn tenant_limits(&mut self) -> Result<tok_core::quotas::TenantLimits> {
                tenant_limits_in(&mut self.tx, &self.job.tenant_id).await
            }

            async fn recent_starts(
                &mut self,
                automation: &AutomationId,
                since: i64,
                limit: u32,
            ) -> Result<Vec<i64>> {
                recent_starts_in(&mut self.tx, &self.job.tenant_id, automation, since, limit).await
            }

            async fn run_ended(&mut self, ended: RunEnded) -> Result<()> {
                run_ended_in(&mut self.tx, &self.job.tenant_id, &ended).await
            }

            async fn run_context(&mut self) -> Result<Value> {
                let context = context_in(&mut self.tx, &self.job.tenant_id, &self.job.run_id).await?;
                context.ok_or(StoreError::NotFound("run"))
            }

            async fn members(&mut self, ids: &[String]) -> Result<Vec<Member>> {
                $crate::approvals::sql::members_in::<<$store as $crate::sql::SqlStore>::Driver>(
                    &mut self.tx,
                    &self.job.tenant_id,
                    ids,
                )
                .await
            }

            async fn open_approval(&mut self, approval: NewApproval) -> Result<String> {
                $crate::approvals::sql::open_approval_in::<<$store as $crate::sql::SqlStore>::Driver>(
                    &mut self.tx,
                    &self.job.tenant_id,
                    &self.job.run_id,
                    &approval,
                )
                .await
            }

            async fn commit(mut self: Box<Self>, mut record: Record) -> Result<()> {
                let OpenRecord { mut tx, job, status } = *self;
                $crate::storable::mend_record(&mut record);
                write_records(&mut tx, &[(job, record, status)]).await?;
                tx.commit().await?;
                Ok(())
            }
        }

        #[async_trait::async_trait]
        impl RecordStore for $store {
            async fn begin_record(&self, job: &ClaimedJob) -> Result<Box<dyn RecordTx>> {
                let writer = self.writer().await;
                let mut tx = writer.begin().await?;
                // A worker whose lease was taken over gets `LeaseLost`
                // before it writes anything.
                let status = fenced_statuses(&mut tx, std::iter::once(job))
                    .await?
                    .remove(&(job.id.0, job.claim_token.clone()))
                    .ok_or(StoreError::LeaseLost(job.id))?;
                Ok(Box::new(OpenRecord { tx, job: job.clone(), status }))
            }
        }
    };
}

pub(crate) use impl_desk;
