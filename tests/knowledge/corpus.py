"""A small, realistic corpus for ranking and scoping tests: (title, department, text), and queries
whose relevant document must come first."""

DOCUMENTS = [
    ("Employee Handbook: Time Off", "hr", """
Every full-time employee receives 25 vacation days per year, accrued monthly. Unused vacation days
carry over to the next year up to a maximum of 10 days. Request time off in the HR portal at least
two weeks in advance; your manager approves or declines the request.

Public holidays are not counted as vacation days. Sick leave is separate: tell your manager on the
first day of illness and bring a doctor's note after three days.
"""),
    ("VPN Setup Guide", "it", """
To reach internal systems from outside the office you need the company VPN. Install the WireGuard
client on your laptop, then download your personal VPN profile from the IT self-service portal and
import it into WireGuard. Activate the tunnel and check that vpn.acme.example answers.

If the VPN connection drops, restart the WireGuard tunnel. On macOS allow the network extension in
System Settings. Never share your VPN profile: it is tied to your laptop.
"""),
    ("Expense Policy", "finance", """
Employees are reimbursed for business expenses that are reasonable and approved. Submit an expense
report in the finance tool within 30 days, attaching an itemised receipt for every expense above
25 euros. Reimbursement is paid with the next salary run.

Alcohol, fines and personal entertainment are not reimbursable. Corporate card statements must be
reconciled monthly with receipts.
"""),
    ("On-call Runbook", "engineering", """
When you are on call and an alert fires, acknowledge the page in PagerDuty within five minutes.
Open the alert's dashboard, check the error rate and latency graphs, and look at recent deploys.
If customers are affected, declare an incident in the #incidents channel and page the incident
commander. Escalate to the secondary on-call engineer if you cannot acknowledge at night.

After the incident, write a blameless postmortem within two working days.
"""),
    ("Password and Account Recovery", "it", """
If you forgot your password or your account is locked out after too many attempts, use the self-service
password reset at id.acme.example. You need your registered phone for the verification code.
Passwords must be at least 14 characters; a password manager is provided to every employee.
If the reset fails, call the IT helpdesk to unlock the account after verifying your identity.
"""),
    ("Parental Leave Policy", "hr", """
New parents, whether birth, adoptive or foster parents, are entitled to 16 weeks of fully paid
parental leave, taken within the first year after the child arrives. Tell HR about your planned
leave at least eight weeks before it starts. Parental leave can be split into two blocks, and a
phased return to work at reduced hours is available for the first month back.
"""),
    ("Hardware Requests", "it", """
To request a new laptop, monitor, keyboard or headset, open a hardware request ticket in the IT
portal. Standard equipment ships within five working days. Laptops are replaced every three years;
request a replacement earlier only if the device is broken. Return old hardware to IT so the disks
can be wiped.
"""),
    ("Deployment Process", "engineering", """
Every change reaches production through the deploy pipeline. Merge to main, wait for the CI build
and the staging deploy, then promote the release to production with the deploy command. Deploys
are blocked on Fridays after 15:00. If a release misbehaves, roll back immediately with the rollback
command, which redeploys the previous release, and then investigate.
"""),
    ("Travel Policy", "finance", """
Book business travel through the travel booking platform. Flights under six hours are booked in
economy class; longer flights may be booked in premium economy. Hotels should stay within the city
rate limits listed in the platform. Trains are preferred over flights for trips under four hours.
Per diem allowances cover meals while travelling.
"""),
    ("Security Incident Response", "security", """
Report a suspected security incident immediately: a phishing email, a lost laptop, malware or a
leaked credential. Forward phishing emails as attachments to security@acme.example and do not click
links. For a lost or stolen device call the security hotline so the device can be wiped remotely.
The security team triages every report within one hour.
"""),
    ("New Hire Onboarding", "hr", """
Welcome! Your first week follows the onboarding checklist: collect your badge at reception, meet
your buddy, complete the compliance trainings and set up VPN access with IT on day one. By the end of
the first week you should have met your team and read the employee handbook. HR schedules a check-in
after 30 days.
"""),
    ("Database Backups and Restore", "engineering", """
Production databases are backed up every night with point-in-time recovery for 14 days. To restore
a database, create a restore request with the target timestamp; the platform team restores into a
new instance, never over the live one. Backups are tested monthly by restoring a random snapshot
and running consistency checks.
"""),
    ("Code Review Guidelines", "engineering", """
Every pull request needs one approving review before it can be merged. Reviewers check correctness,
tests and readability; keep pull requests small so the review is quick. Authors respond to every
review comment. Use suggestions for small fixes and never approve code you do not understand.
"""),
    ("Office Facilities", "facilities", """
The office guest wifi network is AcmeGuest; the password is posted at reception and changes monthly.
Printers are on every floor: print from the printer queue named after your floor and release the job
with your badge. Meeting rooms are booked in the calendar. Report broken furniture to facilities.
"""),
]

# (query, the title that must rank first)
RANKING = [
    ("How many vacation days do I get per year?", "Employee Handbook: Time Off"),
    ("set up the VPN on my laptop with WireGuard", "VPN Setup Guide"),
    ("submit an expense report with receipts for reimbursement", "Expense Policy"),
    ("an alert fired while I am on call, what do I do?", "On-call Runbook"),
    ("I forgot my password and my account is locked", "Password and Account Recovery"),
    ("parental leave for new parents", "Parental Leave Policy"),
    ("request a new monitor", "Hardware Requests"),
    ("how do I roll back a bad release in production", "Deployment Process"),
    ("booking flights and hotels for business travel", "Travel Policy"),
    ("I received a phishing email", "Security Incident Response"),
    ("onboarding checklist for the first week", "New Hire Onboarding"),
    ("restore a database from backup", "Database Backups and Restore"),
    ("pull request review guidelines", "Code Review Guidelines"),
    ("guest wifi password and printers", "Office Facilities"),
]
