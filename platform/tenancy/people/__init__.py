"""The people of a tenant: invitations by email, members' roles, and each person's profile.

`services` makes the changes (each recorded in the tenant's audit trail), `forms` and `pages` are the
console's pages for them, `zones` shows every page in the viewer's time zone. Roles and removal go through
`tenancy.services.membership_set` and `membership_remove`, as the API and the commands do.
"""
